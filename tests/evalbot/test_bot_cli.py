"""The maintainer commands against the GitHub double and a real git remote: each says what it changed,
and --dry-run changes nothing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from evalbot.cli import bot_cmd, main
from evalbot.github import PyGithubAdapter
from evalbot.ledgers import BLOCKED_PATH, parse_blocked, read_ledgers
from evalbot.store import EvalKey, Store
from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.state import Fault

pytest_plugins = ["tests.github_double.fixture"]  # github_double


@pytest.fixture
def bot(github_double, tmp_path):
    st = github_double.state
    repo = BareRepo.create(tmp_path / "remote.git", {"engine/model.py": "x = 0\n"}, when=st.now)
    add_git_pull(st, repo, 7, {"engine/model.py": "x = 1\n"}, author_login="alice")
    args = ["--repo", github_double.repo, "--api-url", github_double.base_url, "--git-remote", repo.url,
            "--state", str(tmp_path / "state.db")]  # fmt: skip

    def run(*argv: str) -> str:
        result = CliRunner().invoke(
            main, [*argv, *args], env={"GITHUB_TOKEN": "ghp_t", "USER": "maint"}, catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return result.output

    return run, repo, tmp_path / "state.db"


def test_block_and_unblock_write_the_ledger_and_dry_run_changes_nothing(bot):
    run, repo, _ = bot
    assert "[dry run] would: block eve" in run("block", "eve", "--reason", "copies", "--dry-run")
    assert parse_blocked(read_ledgers(repo.url)[BLOCKED_PATH]) == []
    assert run("block", "eve", "--reason", "copies") == "block eve (copies)\n"
    assert "already blocked" in run("block", "eve")
    assert [e.login for e in parse_blocked(read_ledgers(repo.url)[BLOCKED_PATH])] == ["eve"]
    assert run("unblock", "eve") == "unblock eve (unblocked by a maintainer)\n"
    assert parse_blocked(read_ledgers(repo.url)[BLOCKED_PATH]) == []
    out = run("ledger")
    assert "blocked: none" in out and "flagged: none" in out


def test_hold_rerun_and_status(bot, github_double):
    run, repo, state = bot
    assert run("hold", "7", "--reason", "needs a look") == "hold #7: needs a look\n"
    assert "#7 on hold by maint: needs a look" in run("status")
    assert "nothing: #7 is already on hold" in run("hold", "7")
    assert "release the hold on #7" in run("hold", "7", "--release")
    head = github_double.state.pulls[7].head_sha
    assert "[dry run] would: queue #7" in run("rerun", "7", "--dry-run")
    with Store(state) as store:
        assert store.queue.evaluations(pr=7) == []
    out = run("rerun", "7")
    assert out.startswith(f"queue #7 at {head[:12]} against main {repo.rev('main')[:12]}")
    with Store(state) as store:
        (rec,) = store.queue.evaluations(pr=7)
        assert rec.key == EvalKey(7, head, repo.rev("main"), rec.key.rules_hash) and rec.state == "queued"
    assert "replacing a queued evaluation" in run("rerun", "7")


def test_poll_reports_a_github_outage_clearly_and_changes_nothing(bot, github_double, monkeypatch):
    _run, _, state = bot
    gh = PyGithubAdapter.from_token(
        github_double.repo, "ghp_t", base_url=github_double.base_url, pace=False, sleep=lambda s: None
    )
    monkeypatch.setattr(bot_cmd.Ctx, "github", lambda self: gh)
    github_double.state.inject("user.get", *[Fault.server_error(502)] * 5)
    result = CliRunner().invoke(main, ["poll", "--once", "--repo", github_double.repo, "--state", str(state)],
                                env={"GITHUB_TOKEN": "ghp_t"})  # fmt: skip
    assert result.exit_code == 1 and isinstance(
        result.exception, SystemExit
    )  # a ClickException, no traceback
    assert "HTTP 502" in result.output and "nothing was done" in result.output
    assert not state.exists()  # the bot opened no state: it knew it could not tell its own comments

    github_double.state.inject("pulls.list", *[Fault.server_error(503)] * 5)
    result = CliRunner().invoke(main, ["poll", "--once", "--bot-login", "evalbot", "--repo", github_double.repo,
                                       "--state", str(state)], env={"GITHUB_TOKEN": "ghp_t"})  # fmt: skip
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "GitHub unavailable, poll given up" in result.output and "HTTP 503" in result.output


def test_environment_variables_are_declared_on_their_options(github_double, tmp_path):
    """EVALBOT_REPO and EVALBOT_STATE are click envvars: shown in --help, honoured, and a flag wins."""
    help_text = CliRunner().invoke(main, ["status", "--help"]).output
    assert "EVALBOT_REPO" in help_text and "EVALBOT_STATE" in help_text
    state = tmp_path / "from-env" / "state.db"
    env = {"GITHUB_TOKEN": "ghp_t", "EVALBOT_REPO": github_double.repo, "EVALBOT_STATE": str(state)}
    r = CliRunner().invoke(main, ["status", "--api-url", github_double.base_url], env=env)
    assert r.exit_code == 0, r.output
    assert state.exists()  # the state the environment named
    other = tmp_path / "flag.db"
    r = CliRunner().invoke(
        main, ["status", "--api-url", github_double.base_url, "--state", str(other)], env=env
    )
    assert r.exit_code == 0 and other.exists(), r.output
    r = CliRunner().invoke(main, ["poll", "--once", "--api-url", github_double.base_url, "--state", str(other)],
                           env={"GITHUB_TOKEN": "t", "EVALBOT_REPO": ""})  # fmt: skip
    assert r.exit_code != 0 and "which repository?" in r.output


def test_clearing_a_copycat_flag_swaps_it_for_copycat_cleared_and_the_screen_leaves_that_alone(
    bot, github_double
):
    run, _, _ = bot
    pull = github_double.state.pulls[7]
    pull.labels[:] = ["copycat-warn", "area:kernels"]
    out = run("clear", "7", "--reason", "independent work: a maintainer compared both")
    assert "add ['copycat-cleared']" in out
    assert set(pull.labels) == {"copycat-cleared", "area:kernels"}
    from evalbot.rules import LabelFamily, default_rules_dir, load_rules

    rules = load_rules(default_rules_dir())
    # no label family owns it, so no poll takes it off (the screen does only when it flags a later head,
    # test_screen.py); and it blocks no merge
    owned = set().union(*(rules.owned(f) for f in LabelFamily if f is not LabelFamily.CLEARED))
    assert "copycat-cleared" not in owned and "copycat-cleared" not in rules.automerge.blocking_labels
    pull.labels[:] = ["flagged:gaming"]  # a gaming flag cleared is no copycat clearance
    assert "copycat-cleared" not in run("clear", "7", "--reason", "a maintainer looked")
    assert pull.labels == []
