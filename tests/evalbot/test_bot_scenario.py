"""The whole bot on a contest modelled on the seeds: the real poller, the real `evaluate` (on the fixture
engine), the real store and ledgers, against the GitHub double serving real git.

Nine PRs: two genuine speedups (one becomes merge-first; its head moves between measurement and merge,
so it is merged only at its re-measured sha; the other gets needs-rebase, is pushed again after main
moved, and is credited its marginal gain), a regression, a blocked author, a PR flagged through one of
its commit authors and then cleared by a maintainer, a harness edit, an empty benchmark table, a tiny
copy of another PR, and a draft. The bot is killed once right after GitHub accepted a comment and
started again: no comment is ever duplicated, and the pending edit is reconciled, not redone.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from evalbot.cli import main as cli_main
from evalbot.copycat.screen import CopycatScreen
from evalbot.github import PyGithubAdapter
from evalbot.judge import local_evaluator
from evalbot.ledgers import BLOCKED_PATH, FLAGGED_PATH, parse_blocked, parse_flagged, read_ledgers
from evalbot.mirror import Mirror
from evalbot.model import RunOptions
from evalbot.poller import Bot, BotSettings
from evalbot.render import MARKER
from evalbot.rules import load_rules
from evalbot.store import Store
from tests.evalbot.test_fixture_e2e import write_rules
from tests.fixtures import fixture_engine_branches as fb
from tests.github_double.gitrepo import BareRepo, add_git_pull, push_git_commit
from tests.github_double.serve import serve

pytestmark = [
    pytest.mark.timing,
    pytest.mark.skipif(
        shutil.which("bwrap") is None
        or subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True
        ).returncode,
        reason="bubblewrap cannot create namespaces here",
    ),
]

BOT = "evalbot[bot]"
TOKEN = "ghp_scenario"
GOOD_BODY = """\
## What this changes

{what}

## Local benchmark

- [x] Tested: I ran the benchmark below on `main` and on this branch, on the same machine

| model | context | base tok/s | head tok/s | change |
|-------|---------|------------|------------|--------|
| fixture-tiny | 128 | 600 | {head128} | {gain} |
| fixture-tiny | 512 | 160 | {head512} | {gain} |
"""
EMPTY_TABLE_BODY = GOOD_BODY.format(what="Faster.", head128="TBD", head512="", gain="")


def body(what: str, gain: float) -> str:
    return GOOD_BODY.format(
        what=what, head128=round(600 * (1 + gain)), head512=round(160 * (1 + gain)), gain=f"+{gain:.0%}"
    )


def template_files() -> dict[str, str]:
    return {str(p.relative_to(fb.TEMPLATE)): p.read_text() for p in sorted(fb.TEMPLATE.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}  # fmt: skip


def branch_files(tmp: Path, *edits: fb.Edit, base: dict[str, str] | None = None) -> dict[str, str]:
    """The files a set of edits changes, as full new texts (what add_git_pull commits)."""
    root = tmp / f"edit-{random.getrandbits(32):08x}"
    files = base or template_files()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for edit in edits:
        edit.apply(root)
    return {name: (root / name).read_text() for name in files if (root / name).read_text() != files[name]}


SCORES_LOOP = """    for s in range(s_len):
        scores[:, s] = (k[s] * q).sum(-1)
"""
OUTPUT_LOOP = """    out = np.zeros_like(q)
    for s in range(s_len):
        out += p[:, s, None] * v[s]
    return out
"""
FAST_SCORES = fb.Edit("engine/model.py", old=SCORES_LOOP,
                      new="    scores[:] = np.einsum(\"shd,hd->hs\", k, q)  # every position at once\n")  # fmt: skip
FAST_OUTPUT = fb.Edit("engine/model.py", old=OUTPUT_LOOP,
                      new="    return np.einsum(\"hs,shd->hd\", p, v)  # weighted sum in one call\n")  # fmt: skip


class Killed(BaseException):
    """The bot process dying right after GitHub accepted a request."""


def test_a_contest_round_end_to_end(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    fetched = subprocess.run([sys.executable, "-m", "engine.registry", "fetch", fb.MODEL_NAME], cwd=fb.TEMPLATE,
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
    import hashlib

    model = Path(fetched.stdout.strip().splitlines()[-1])
    # up to 12 pairs per context (4 to 6 blocks): the fixture's speedups are 3-10x, which a tier's lower
    # bound resolves in 4 blocks; the A/B stops there when no further pair could change the verdict. With a
    # cap of 8 (4 blocks, no more) one stalled pair on a noisy host left a 3x speedup INCONCLUSIVE (MDE
    # 1048%) in 2 of 13 runs on 2026-12-04, and the round then went another way than this test follows
    rules_dir = write_rules(tmp_path / "rules", hashlib.sha256(model.read_bytes()).hexdigest(), max_pairs=12)
    (rules_dir / "automerge.yaml").write_text(
        (rules_dir / "automerge.yaml").read_text().replace("enabled: false", "enabled: true")
    )
    rules = load_rules(rules_dir)
    assert rules.automerge.enabled

    with serve() as double:
        st = double.state
        repo = BareRepo.create(tmp_path / "remote.git", template_files(), when=st.now)
        st.clone_url = repo.url
        st.add_workflow("ci.yml")

        def ci_passes(number):  # this repository's CI ran on the PR's current head and passed
            run = st.start_run("ci.yml", st.pulls[number].head_ref, {}, event="pull_request")
            st.complete_run(run.id, "success")

        def pr(number, login, name, files, text, **kw):
            person = (name, f"{login}@example.com")
            return add_git_pull(st, repo, number, files, author_login=login, author=person, body=text, **kw)

        pr(
            1,
            "alice",
            "Alice",
            branch_files(tmp_path, FAST_SCORES),
            body("Vectorize the decode scores.", 0.4),
        )
        pr(2, "bob", "Bob", branch_files(tmp_path, FAST_OUTPUT), body("Vectorize the decode output.", 0.3))
        pr(
            3,
            "carol",
            "Carol",
            branch_files(tmp_path, *fb.REGRESS_LONG.edits),
            body("Attention sinks.", 0.02),
        )
        pr(4, "mallory", "Mallory", branch_files(tmp_path, FAST_SCORES), body("Faster!", 3.0))
        pr(
            5,
            "dave",
            "Dave",
            {"engine/tokenizer.py": template_files()["engine/tokenizer.py"] + "\n# tidy\n"},
            body("Tidy the tokenizer.", 0.03),
        )
        st.users_by_email["mallory@evil.example"] = "mallory"
        push_git_commit(st, repo, 5, {"engine/tokenizer.py": template_files()["engine/tokenizer.py"] + "\n# tidy!\n"},
                        "Co-authored tidy", author=("Mallory", "mallory@evil.example"))  # fmt: skip
        pr(6, "erin", "Erin", branch_files(tmp_path, *fb.EDIT_BENCH_DRIVER.edits), body("Bench fix.", 0.5))
        pr(7, "frank", "Frank", branch_files(tmp_path, FAST_OUTPUT), EMPTY_TABLE_BODY)
        pr(8, "grace", "Grace", branch_files(tmp_path, FAST_SCORES), body("Scores, vectorized.", 1.4))
        pr(9, "heidi", "Heidi", branch_files(tmp_path, FAST_OUTPUT), body("WIP", 0.5))
        st.pulls[9].draft = True
        for n in st.pulls:
            ci_passes(n)

        cli_env = {"GITHUB_TOKEN": TOKEN, "USER": "maintainer"}
        cli_args = ["--repo", double.repo, "--api-url", double.base_url, "--git-remote", repo.url,
                    "--state", str(tmp_path / "state.db"), "--rules", str(rules_dir)]  # fmt: skip

        def cli(*argv):
            result = CliRunner().invoke(cli_main, [*argv, *cli_args], env=cli_env, catch_exceptions=False)
            assert result.exit_code == 0, result.output
            return result.output

        out = cli("block", "mallory", "--reason", "copied three PRs")
        assert "block mallory" in out

        log: list[str] = []
        measured_then_moved: dict[int, str] = {}

        def make_bot(dead: str | None = None) -> tuple[Bot, Store, PyGithubAdapter]:
            gh = PyGithubAdapter.from_token(double.repo, TOKEN, base_url=double.base_url, pace=False, timeout=5.0,
                                            rng=random.Random(0))  # fmt: skip
            real_merge = gh.merge

            def merge_after_a_push(number, sha, *a, **kw):
                # the first winner's contributor pushes right after the measurement, before the merge lands
                if not measured_then_moved:
                    measured_then_moved[number] = sha
                    text = repo.git("show", f"{sha}:README.md", strip=False) + "\nMeasured with evalbot.\n"
                    push_git_commit(st, repo, number, {"README.md": text}, "Follow-up: README")
                    ci_passes(number)
                return real_merge(number, sha, *a, **kw)

            gh.merge = merge_after_a_push  # type: ignore[method-assign]
            store = Store(tmp_path / "state.db")
            mirror = Mirror(repo.url, tmp_path / "work" / "mirror.git")
            settings = BotSettings(bot_login=BOT, automerge_env=True, ledger_remote=repo.url,
                                   options=RunOptions(spec=False, accuracy=False))  # fmt: skip
            evaluator = local_evaluator(rules, tmp_path / "work", log.append)
            # a restart takes over the lease of the bot that died (here: killed in this process), as `evalbot
            # poll` does for a dead pid of this host
            bot = Bot(gh, store, rules, settings, mirror, evaluator, log.append,
                      screen=CopycatScreen(store, rules, mirror.path), owner_gone=lambda owner: owner == dead)  # fmt: skip
            return bot, store, gh

        # --- poll 1: intake, evaluations, the round; the winner's head moves before its merge ---------
        bot, store, gh = make_bot()
        first = bot.poll_once()
        assert set(first.evaluated) == {1, 2, 3}, (first, log[-20:])
        winner = measured_then_moved and next(iter(measured_then_moved))
        assert winner in (1, 2) and not first.merged, "\n".join(
            [repr((e.key.pr, e.status, e.verdict and (e.verdict.tier, e.verdict.reasons))) for e in store.queue.evaluations()]
            + [repr(first)])  # fmt: skip
        assert not st.pulls[winner].merged and "re-evaluate" in gh.get_pull(winner).labels
        other = 3 - winner

        # --- poll 2, killed right after GitHub accepted a comment edit; then started again -----------
        real_edit = gh.edit_comment

        def edit_then_die(comment_id, text):
            real_edit(comment_id, text)
            raise Killed(f"killed after editing comment {comment_id}")

        gh.edit_comment = edit_then_die  # type: ignore[method-assign]
        with pytest.raises(Killed):
            bot.poll_once()
        assert [a.kind for a in store.actions.pending_actions()] == [
            "comment"
        ]  # the edit's outcome is unknown
        store.close()
        bot, store, gh = make_bot(dead=bot.settings.worker)
        second = bot.poll_once()
        assert any(line.startswith("reconciled comment") for line in log), log[-40:]
        moved = winner  # merge-first in poll 1; its head moved before the merge, so the merge was refused

        def why(n):  # what the bot decided for PR n, for a failing assertion
            return [
                (
                    e.key.head_sha[:8],
                    e.key.base_sha[:8],
                    e.state,
                    e.status,
                    e.verdict and (e.verdict.tier, e.verdict.lower_bound_gain, e.verdict.reasons),
                    e.error,
                )
                for e in store.queue.evaluations(pr=n)
            ]

        assert len(second.merged) == 1 and second.merged[0] in (1, 2), (
            f"notes={second.notes} merged={second.merged} #1={why(1)} #2={why(2)} labels="
            f"{[gh.get_pull(n).labels for n in (1, 2)]} log={log[-12:]}"
        )
        winner = second.merged[0]
        moved_merges = [r.body["sha"] for r in st.requests
                        if r.method == "PUT" and r.path.endswith(f"/pulls/{moved}/merge")]  # fmt: skip
        if winner == moved:  # measured again at its new head, it still leads: merged there, never at the old
            merged_at = st.pulls[winner].head_sha
            assert merged_at != measured_then_moved[moved]
            assert moved_merges == [measured_then_moved[moved], merged_at]
        else:  # two comparable speedups: measured again, its lower bound fell below the other's, which
            # merges first; the moved PR was never merged, at its old head or its new one
            assert moved_merges == [measured_then_moved[moved]] and not st.pulls[moved].merged
            assert any(e.key.head_sha == st.pulls[moved].head_sha for e in store.queue.evaluations(pr=moved))
        other = 3 - winner
        assert "needs-rebase" in gh.get_pull(other).labels, (
            f"#{other} labels {gh.get_pull(other).labels}; #1={why(1)} #2={why(2)}; log={log[-30:]}"
        )

        # --- a maintainer clears #5, and the other speedup is pushed again after main moved ----------
        out = cli("clear", "5", "--reason", "mallory co-authored one commit; dave is not blocked")
        assert "reopen #5" in out
        rebased = branch_files(
            tmp_path,
            FAST_SCORES if other == 1 else FAST_OUTPUT,
            base={"engine/model.py": repo.git("show", "main:engine/model.py", strip=False)},
        )
        repo.git(
            "update-ref", "-d", f"refs/heads/{st.pulls[other].head_ref}"
        )  # a rebase: the branch restarts
        push_git_commit(st, repo, other, rebased, "Rebase on main")  # from main
        ci_passes(other)
        third = bot.poll_once()
        assert other in third.evaluated and 5 in third.evaluated, (third, log[-30:])

        # --- the final state on GitHub, in the store and in the ledgers --------------------------------
        pulls = st.pulls

        assert pulls[winner].merged, (winner, why(winner), log[-30:])
        assert pulls[other].merged, (
            other,
            third.notes,
            gh.get_pull(other).labels,
            [line for line in log if f"#{other}" in line][-15:],
            why(other),
        )
        credits = {e.pr: e for e in store.rounds.ledger()}
        assert credits[winner].gain and credits[winner].gain > 0.18  # XL: a vectorized loop
        assert credits[other].marginal_gain is not None and credits[other].marginal_gain > 0  # over new main
        first_round = store.rounds.round(first.main_sha)
        assert first_round is not None and first_round.winner == winner and first_round.closed_at
        assert {m.pr for m in first_round.members} == {1, 2}  # the PASSes measured against that main

        labels = {n: set(gh.get_pull(n).labels) for n in pulls}
        assert "regression" in labels[3] and pulls[3].state == "open"
        assert pulls[4].state == "closed" and "flagged:gaming" in labels[4]
        assert pulls[5].state == "open" and "flagged:gaming" not in labels[5]
        assert "skipped:sensitive" in labels[6] and not store.queue.evaluations(pr=6)
        assert "needs-benchmark" in labels[7] and not store.queue.evaluations(pr=7)
        assert "copycat-warn" in labels[8] and not store.queue.evaluations(pr=8)
        assert labels[9] == set() and not st.comments_on(9)

        for n in pulls:  # one bot comment per PR, edited in place, across the kill and restart
            mine = [c for c in st.comments_on(n) if c.author == BOT and MARKER in c.body]
            assert len(mine) <= 1, (n, [c.body[:80] for c in mine])
        regression = next(c for c in st.comments_on(3) if c.author == BOT).body
        assert "512" in regression and "regression" in regression.lower()

        ledgers = read_ledgers(repo.url)
        flagged = {(e.pr, e.label): e for e in parse_flagged(ledgers[FLAGGED_PATH])}
        assert not flagged[(4, "flagged:gaming")].cleared and flagged[(5, "flagged:gaming")].cleared
        assert [e.login for e in parse_blocked(ledgers[BLOCKED_PATH])] == ["mallory"]
        if os.environ.get("EVALBOT_SCENARIO_DUMP"):  # for a human to read what the bot posted
            dump = Path(os.environ["EVALBOT_SCENARIO_DUMP"])
            dump.mkdir(parents=True, exist_ok=True)
            for n in pulls:
                for c in st.comments_on(n):
                    (dump / f"pr{n}-comment{c.id}.md").write_text(c.body)
            (dump / "FLAGGED.md").write_text(ledgers[FLAGGED_PATH])
        status = cli("status")
        assert "#3" in status and "REJECT" in status
        store.close()
