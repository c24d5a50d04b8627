"""The maintainers' bot commands: poll, status, rerun, hold, clear, block, unblock, ledger.

Each command says what it changed; `--dry-run` shows it first and changes nothing. Secrets (the GitHub
token, the receipt signing key) are read here from the environment and passed down as objects.

    evalbot poll --once            evalbot status [PR]       evalbot rerun PR     evalbot hold PR
    evalbot clear PR --reason TEXT evalbot block USER        evalbot unblock USER evalbot ledger
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from evalbot import ledgers
from evalbot.cli.options import (
    load_rules_or_exit,
    resolve_state,
    rules_option,
    state_option,
)
from evalbot.cli.receipt_cmd import SIGNING_KEY_ENV
from evalbot.model import RunOptions
from evalbot.rules import LabelFamily, Rules, automerge_allowed, is_login
from evalbot.store import EvalKey, Store, StoreError

TOKEN_ENV = "GITHUB_TOKEN"
REPO_ENV = "EVALBOT_REPO"  # owner/name
ACTIONS_LOGIN = "github-actions[bot]"  # who comments with an Actions job token (which has no /user)


SERVER_ENV = "GITHUB_SERVER_URL"  # set by Actions runners: github.com, or a GitHub Enterprise Server


def git_remote_url(server: str, repo: str, token: str) -> str:
    """The repository's git URL on `server` (a runner's GITHUB_SERVER_URL), with the token for http(s)."""
    scheme, sep, rest = server.rstrip("/").partition("://")
    if token and sep and scheme in ("http", "https"):
        rest = f"x-access-token:{token}@{rest}"
    return f"{scheme}{sep}{rest}/{repo}.git"


@dataclass(frozen=True)
class Ctx:
    """What every bot command shares: where the state is, which repository, and how to reach it."""

    state: Path
    repo: str | None
    api_url: str
    git_remote: str | None
    bot_login: str | None
    rules_dir: Path | None
    dry_run: bool
    by: str = "maintainer"  # who a maintainer's command is recorded as

    @functools.cached_property
    def rules(self) -> Rules:
        return load_rules_or_exit(self.rules_dir)

    def store(self) -> Store:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        try:
            return Store(self.state)
        except StoreError as exc:
            raise click.ClickException(f"state {self.state}: {exc}") from exc

    def github(self) -> Any:
        from evalbot.github import PyGithubAdapter

        token = os.environ.get(TOKEN_ENV)
        if not self.repo:
            raise click.ClickException(f"which repository? pass --repo OWNER/NAME or set {REPO_ENV}")
        if not token:
            raise click.ClickException(f"no GitHub token: set {TOKEN_ENV}")
        return PyGithubAdapter.from_token(self.repo, token, base_url=self.api_url)

    def remote(self) -> str:
        if self.git_remote:
            return self.git_remote
        if not self.repo:
            raise click.ClickException(f"which repository? pass --repo OWNER/NAME or set {REPO_ENV}")
        return git_remote_url(os.environ.get(SERVER_ENV) or "https://github.com", self.repo,
                              os.environ.get(TOKEN_ENV, ""))  # fmt: skip


def bot_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every bot command takes, folded into one Ctx argument."""

    @state_option
    @click.option(
        "--repo", "repo", default=None, envvar=REPO_ENV, show_envvar=True, help="OWNER/NAME on GitHub"
    )
    @click.option("--api-url", default="https://api.github.com", show_default=True)
    @click.option(
        "--git-remote", default=None, help="git URL to fetch from and push ledgers to (default: GitHub)"
    )
    @click.option(
        "--bot-login",
        default=None,
        help="the bot's GitHub login, to find its own comments (default: the token's user, else github-actions[bot])",
    )
    @rules_option
    @click.option("--dry-run", is_flag=True, help="show what would change and change nothing")
    @click.option(
        "--by",
        default="maintainer",
        envvar="USER",
        show_envvar=True,
        show_default=True,
        help="who a hold, clear, block or unblock is recorded as",
    )
    @functools.wraps(f)
    def wrapper(state, repo, api_url, git_remote, bot_login, rules_dir, dry_run, by, **kw):
        ctx = Ctx(resolve_state(state), repo or None,
                  api_url, git_remote, bot_login, rules_dir, dry_run, by or "maintainer")  # fmt: skip
        return f(ctx, **kw)

    return wrapper


def _say(ctx: Ctx, message: str) -> None:
    click.echo(("[dry run] would: " if ctx.dry_run else "") + message)


def _login(value: str) -> str:
    """A GitHub login, checked with the one pattern before anything changes."""
    if not is_login(value):
        raise click.ClickException(
            f"{value[:80]!r} is not a GitHub login (letters, digits and hyphens, at most 39 "
            "characters, not starting with a hyphen); nothing changed"
        )
    return value


def _reason(value: str) -> str:
    """A maintainer's reason: one line of text, never empty."""
    text = " ".join(value.split())
    if not text:
        raise click.ClickException("--reason must say why (it goes into the ledgers); nothing changed")
    return text[:500]


def _existing_pull(ctx: Ctx, pr: int) -> tuple[Any, Any]:
    """The PR's facts from GitHub; a clear error when it does not exist (checked before anything changes)."""
    from evalbot.github import GitHubError

    if pr <= 0:
        raise click.ClickException(f"{pr} is not a PR number; nothing changed")
    gh = ctx.github()
    try:
        return gh, gh.get_pull(pr)
    except GitHubError as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            raise click.ClickException(f"#{pr}: no such pull request in {ctx.repo}; nothing changed") from exc
        raise click.ClickException(f"#{pr}: GitHub: {exc}; nothing changed") from exc


# ---------------------------------------------------------------- poll


@click.command()
@bot_options
@click.option("--once", is_flag=True, help="one pass, then exit (cron); otherwise poll every --interval")
@click.option("--interval", type=int, default=300, show_default=True, help="seconds between polls")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--max-pairs", type=int, default=None, help="cap A/B pairs per context")
@click.option(
    "--wait",
    "wait_s",
    type=int,
    default=0,
    show_default=True,
    help="while another poller holds this store's lease, wait up to this many seconds for it",
)
def poll(
    ctx: Ctx,
    once: bool,
    interval: int,
    work_dir: Path | None,
    max_pairs: int | None,
    wait_s: int,
) -> None:
    """Poll GitHub: intake every open PR, evaluate what is new, publish, rank the round, merge the winner.
    One poller per store: the store holds a lease (owner, heartbeat, expiry) that a second one refuses on.
    Every PR is measured on the profile the rules name (dispatch.yaml's profile)."""
    _poll(ctx, once, interval, work_dir, max_pairs, wait_s)


def _poll(
    ctx: Ctx,
    once: bool,
    interval: int,
    work_dir: Path | None,
    max_pairs: int | None,
    wait_s: int = 0,
) -> None:
    from evalbot import receipts
    from evalbot.copycat import CopycatScreen
    from evalbot.github import GitHubError
    from evalbot.judge import local_evaluator
    from evalbot.mirror import Mirror
    from evalbot.poller import Bot, BotSettings

    raw_key = (os.environ.get(SIGNING_KEY_ENV) or "").encode()
    key = receipts.load_private_key(raw_key) if raw_key else None
    work = work_dir or ctx.state.parent / "work"
    log = functools.partial(click.echo, err=True)
    gh = ctx.github()
    # the bot's own comments are found by author: never let a user's copy of the marker count as ours; asked
    # before the store is opened, so that an outage leaves no state file behind
    try:
        bot_login = ctx.bot_login or gh.authenticated_login() or ACTIONS_LOGIN
    except GitHubError as exc:
        raise click.ClickException(f"GitHub: {exc}; nothing was done (or pass --bot-login)") from exc
    settings = BotSettings(bot_login=bot_login, automerge_env=automerge_allowed(ctx.rules, os.environ),
                           ledger_remote=ctx.remote(), options=RunOptions(max_pairs=max_pairs))  # fmt: skip
    with ctx.store() as store:
        # before anything is read from or written to the store: a second poller on it refuses or waits
        lease = None if ctx.dry_run else _wait_for_lease(store, settings.worker, wait_s, log)
        try:
            mirror = Mirror(ctx.remote(), work / "mirror.git")
            bot = Bot(gh, store, ctx.rules, settings, mirror,
                      local_evaluator(ctx.rules, work, log, key=key), log,
                      screen=CopycatScreen(store, ctx.rules, mirror.path), dry_run=ctx.dry_run,
                      lease=lease)  # fmt: skip
            _poll_loop(bot, once, interval, log)
        finally:
            if lease is not None:
                lease.stop()


def _wait_for_lease(store: Store, worker: str, wait_s: int, log: Callable[[str], None]) -> Any:
    """The store's poller lease, held (heartbeat running) by this process; waits up to wait_s while another
    live poller holds it, then refuses naming that holder."""
    from evalbot.poller import BotSettings
    from evalbot.store import LeaseHeldError, LeaseKeeper, owner_gone

    keeper = LeaseKeeper(store.leases, worker, BotSettings.lease_ttl_s, gone=owner_gone)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            keeper.start()
            return keeper
        except LeaseHeldError as exc:
            if time.monotonic() >= deadline:
                raise click.ClickException(
                    f"{exc}; refusing to start a second poller on this store (--wait SECONDS waits for it)"
                ) from None
            log(f"waiting for the store's poller lease: {exc}")
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.1)))


def _poll_loop(bot: Any, once: bool, interval: int, log: Callable[[str], None]) -> None:
    from evalbot.github import GitHubUnavailable

    while True:
        try:
            report = bot.poll_once()
        except GitHubUnavailable as exc:
            # an infrastructure fault: what was queued or half-done is in the state and resumes next poll
            if once:
                raise click.ClickException(
                    f"GitHub unavailable, poll given up (the next one resumes): {exc}"
                ) from exc
            log(f"GitHub unavailable, polling again in {interval} s: {exc}")
            time.sleep(interval)
            continue
        if report.idle:
            click.echo("nothing changed on GitHub; nothing queued")
        else:
            click.echo(f"main {report.main_sha[:12]}: saw {report.seen}, evaluated {report.evaluated}, "
                       f"merged {report.merged}")  # fmt: skip
            for note in report.notes:
                click.echo(f"  {note}")
        if once:
            return
        time.sleep(interval)


# ---------------------------------------------------------------- status, rerun, hold


@click.command()
@bot_options
@click.argument("pr", type=int, required=False)
def status(ctx: Ctx, pr: int | None) -> None:
    """What the bot knows: every PR's evaluations, or one PR's in detail (read-only)."""
    with ctx.store() as store:
        records = store.queue.evaluations(pr=pr)
        if not records:
            click.echo("no evaluations" + (f" for #{pr}" if pr else ""))
        for r in records:
            v = r.verdict
            verdict = f"{v.status.value}{' ' + v.tier if v.tier else ''}" if v else "-"
            click.echo(f"#{r.key.pr} head {r.key.head_sha[:12]} main {r.key.base_sha[:12]} {r.state:8} {verdict}"
                       + (f" ({'; '.join(v.reasons)[:160]})" if v and pr else "")
                       + (f" error: {r.error}" if r.error else ""))  # fmt: skip
        for h in store.moderation.holds():
            if pr in (None, h.pr):
                click.echo(f"#{h.pr} on hold by {h.by}: {h.reason}")


@click.command()
@bot_options
@click.argument("pr", type=int)
def rerun(ctx: Ctx, pr: int) -> None:
    """Measure a PR again at its current head against the current main (a new evaluation, the old kept)."""
    _, facts = _existing_pull(ctx, pr)
    from evalbot.mirror import Mirror

    with ctx.store() as store:
        mirror = Mirror(ctx.remote(), ctx.state.parent / "work" / "mirror.git")
        mirror.fetch()
        main = mirror.sha("main")
        key = EvalKey(pr, facts.head_sha, main, ctx.rules.rules_hash)
        existing = store.queue.evaluation(key)
        _say(ctx, f"queue #{pr} at {facts.head_sha[:12]} against main {main[:12]}"
             + (f" (replacing a {existing.state} evaluation)" if existing else ""))  # fmt: skip
        if not ctx.dry_run:
            store.queue.requeue_evaluation(key) if existing else store.queue.enqueue_evaluation(key)


@click.command()
@bot_options
@click.argument("pr", type=int)
@click.option("--reason", default="held by a maintainer", show_default=True)
@click.option("--release", is_flag=True, help="lift the hold instead")
def hold(ctx: Ctx, pr: int, reason: str, release: bool) -> None:
    """Keep the bot's hands off a PR (no evaluation, no merge) until released."""
    reason = _reason(reason)
    by = ctx.by
    if not release:
        _existing_pull(ctx, pr)  # a hold of a PR that does not exist would wait forever
    with ctx.store() as store:
        current = store.moderation.hold_for(pr)
        if release:
            _say(ctx, f"release the hold on #{pr}" if current else f"nothing: #{pr} is not on hold")
            if current and not ctx.dry_run:
                store.moderation.release_hold(pr, by)
            return
        _say(
            ctx,
            f"hold #{pr}: {reason}"
            if not current
            else f"nothing: #{pr} is already on hold ({current.reason})",
        )
        if not current and not ctx.dry_run:
            store.moderation.hold(pr, by, reason)


# ---------------------------------------------------------------- clear, block, unblock, ledger


@click.command()
@bot_options
@click.argument("pr", type=int)
@click.option("--reason", required=True, help="why the flag was a false positive (goes into the ledger)")
def clear(ctx: Ctx, pr: int, reason: str) -> None:
    """Clear a false positive: swap the flag labels, reopen, reset the PR's counts, and log it in the ledgers."""
    reason = _reason(reason)
    rules = ctx.rules
    gh, facts = _existing_pull(ctx, pr)
    flags = rules.owned(LabelFamily.CLEARED)
    present = sorted(set(facts.labels) & flags)
    # a copycat flag taken off leaves its mark: the PR says a maintainer cleared it (and no poll removes it)
    cleared = (
        {rules.labels.copycat_cleared}
        if set(present) & {rules.labels.copycat, rules.labels.copycat_warn}
        else set()
    )
    by = ctx.by
    _say(ctx, f"clear #{pr} at its head {facts.head_sha[:12]} (a later push is screened again)")
    _say(
        ctx,
        f"remove {present or 'no flag labels'} from #{pr}" + (f", add {sorted(cleared)}" if cleared else ""),
    )
    if facts.state == "closed" and not facts.merged:
        _say(ctx, f"reopen #{pr}")
    remote = ctx.remote()
    texts = ledgers.read_ledgers(remote)
    entries, changed = ledgers.clear(ledgers.parse_flagged(texts[ledgers.FLAGGED_PATH]), pr, by, reason)
    _say(ctx, f"mark {changed} FLAGGED.md row(s) of #{pr} cleared by {by}: {reason}")
    if ctx.dry_run:
        return
    from evalbot.publish import Publisher

    with ctx.store() as store:  # the publisher's two-phase actions: a crash here is reconciled, not redone
        store.moderation.add_clear(pr, by, reason, head_sha=facts.head_sha)
        publisher = Publisher(gh, store, bot_login=ctx.bot_login, log=lambda line: _say(ctx, line))
        publisher.labels(
            pr, facts.head_sha, facts.labels, (set(facts.labels) - flags) | cleared, flags | cleared
        )
        if facts.state == "closed" and not facts.merged:
            publisher.reopen(pr, facts.head_sha, f"cleared by {by}: {reason}")
    if changed:
        ledgers.commit_ledgers(remote, {ledgers.FLAGGED_PATH: ledgers.render_flagged(entries)},
                               f"ledgers: clear #{pr} ({reason})")  # fmt: skip


def _block_command(*, add: bool, help: str) -> click.Command:
    """`block` or `unblock` a login: one command each, told apart by ``add``."""
    verb = "block" if add else "unblock"

    @click.command(verb, help=help)
    @bot_options
    @click.argument("user")
    @click.option("--reason", default=f"{verb}ed by a maintainer", show_default=True)
    def command(ctx: Ctx, user: str, reason: str) -> None:
        _block(ctx, user, reason, add=add)

    return command


block = _block_command(
    add=True, help="Block a GitHub login: their PRs (as opener, author or committer) are closed unevaluated."
)
unblock = _block_command(add=False, help="Lift a block.")


def _block(ctx: Ctx, user: str, reason: str, *, add: bool) -> None:
    """Block or unblock in the store (the blocklist's one source), then export it to the ledger file."""
    user, reason = _login(user), _reason(reason)
    by = ctx.by
    verb = "block" if add else "unblock"
    if ctx.dry_run:  # read-only: a dry run creates no state file
        blocked: set[str] = set()
        if ctx.state.exists():
            with Store(ctx.state) as store:
                blocked = {e.login.lower() for e in store.moderation.blocklist()}
        _say(
            ctx,
            f"{verb} {user} ({reason})"
            if (user.lower() in blocked) != add
            else f"nothing: {user} is already {verb}ed",
        )
        return
    from evalbot import times
    from evalbot.ledgers import LedgerBook

    with ctx.store() as store:
        changed = (store.moderation.block if add else store.moderation.unblock)(user, reason, by)
        _say(ctx, f"{verb} {user} ({reason})" if changed else f"nothing: {user} is already {verb}ed")
        LedgerBook(store, ctx.remote(), lambda line: click.echo(line, err=True), times.now).sync_blocked()


@click.command()
@bot_options
def ledger(ctx: Ctx) -> None:
    """Print the merges and credits, the flagged PRs and the blocked logins."""
    with ctx.store() as store:
        entries = store.rounds.ledger()
        blocked = store.moderation.blocklist()  # the blocklist's one source; the ledger file is its export
    click.echo("merges and credits:" if entries else "merges and credits: none")
    for e in entries:
        click.echo(
            f"  {e.kind} #{e.pr} {e.sha[:12]} by {e.author}: gain {e.gain}, marginal {e.marginal_gain}"
        )
    try:
        texts = ledgers.read_ledgers(ctx.remote())
    except ledgers.LedgerError as exc:
        click.echo(f"ledgers unreadable: {exc}", err=True)
        sys.exit(3)
    flagged = ledgers.parse_flagged(texts[ledgers.FLAGGED_PATH])
    click.echo("flagged:" if flagged else "flagged: none")
    for f in flagged:
        click.echo(f"  #{f.pr} {f.author} {f.label}: {f.reason} [{f.status}]")
    click.echo("blocked: " + (", ".join(e.login for e in blocked) or "none"))


COMMANDS = (poll, status, rerun, hold, clear, block, unblock, ledger)
