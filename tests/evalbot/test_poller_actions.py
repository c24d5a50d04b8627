"""The poller in `actions` mode: evaluations go to the runner pool through workflow_dispatch, come back as
signed artifacts, and only a verified one is published; a forged one is an INFRA_ERROR and an alert."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from evalbot.github import PyGithubAdapter
from evalbot.mirror import Mirror
from evalbot.poller import Bot, BotSettings
from evalbot.render import MARKER
from evalbot.rules import default_rules_dir, load_rules, rules_hash
from evalbot.store import Store
from tests.evalbot.test_dispatch import (
    ROGUE_KEY,
    RUN_NAME,
    RUNNER_KEY,
    WORKFLOW,
    artifact_files,
    measurements,
    play_runner,
    public_b64,
)
from tests.github_double.gitrepo import BareRepo, add_git_pull

pytest_plugins = ["tests.github_double.fixture"]  # github_double, fake_clock

BOT = "evalbot[bot]"
BODY = """- [x] Tested: I ran the benchmark below on `main` and on this branch

| model | context | base tok/s | head tok/s | change |
|---|---|---|---|---|
| qwen2.5-coder-0.5b | 512 | 9.0 | 9.5 | +5% |
"""


@pytest.fixture
def rules():
    base = load_rules(default_rules_dir())
    d = replace(base.dispatch, mode="actions", runner_public_keys=(public_b64(RUNNER_KEY),))
    actions = replace(base, dispatch=d)
    return replace(actions, rules_hash=rules_hash(actions))


def test_a_run_that_failed_on_a_box_is_dispatched_again_away_from_that_box(
    github_double, fake_clock, rules, tmp_path
):
    """The poller asks the port for the failed run's jobs (list_run_jobs) and excludes their runner."""
    st = _contest(github_double, tmp_path)
    gh = _adapter(github_double, fake_clock)
    with Store(tmp_path / "state.db") as store:
        settings = BotSettings(bot_login=BOT, work_dir=tmp_path / "work")
        mirror = Mirror(st.clone_url, tmp_path / "mirror.git")
        bot = Bot(gh, store, rules, settings, mirror, lambda *_: None, lambda _line: None)
        bot.poll_once()
        (first,) = st.runs.values()
        play_runner(github_double, first.id, None, box="box-bad", conclusion="failure")  # no artifact
        bot.poll_once()
        retry = next(r for r in st.runs.values() if r.id != first.id)
        assert retry.inputs["exclude_runner"] == "box-bad"
        assert [c.path for c in st.calls("runs.jobs")] == [
            f"/repos/{github_double.repo}/actions/runs/{first.id}/jobs"
        ]
        bot.close()


def test_dispatched_evaluations_are_published_only_when_verified(github_double, fake_clock, rules, tmp_path):
    st = github_double.state
    st.add_workflow(WORKFLOW, run_name=RUN_NAME)
    repo = BareRepo.create(
        tmp_path / "remote.git", {"engine/model.py": "x = 1\n", "README.md": "r\n"}, when=st.now
    )
    st.clone_url = repo.url
    add_git_pull(st, repo, 1, {"engine/model.py": "x = 2  # faster\n"}, author_login="alice", body=BODY)
    add_git_pull(st, repo, 2, {"README.md": "r\nfaster docs\n"}, author_login="bob", body=BODY)
    gh = PyGithubAdapter.from_token(github_double.repo, "ghp_test", base_url=github_double.base_url, pace=False,
                                    timeout=2.0, rng=random.Random(0), sleep=fake_clock.sleep,
                                    clock=fake_clock.time)  # fmt: skip
    log: list[str] = []

    def no_local_runs(*_):
        raise AssertionError("actions mode must not run PR code on the poller's box")

    with Store(tmp_path / "state.db") as store:
        settings = BotSettings(bot_login=BOT, work_dir=tmp_path / "work")
        bot = Bot(
            gh, store, rules, settings, Mirror(repo.url, tmp_path / "mirror.git"), no_local_runs, log.append
        )
        first = bot.poll_once()
        assert sum("dispatched to the runner pool" in n for n in first.notes) == 2, first
        runs = {r.inputs["pr"]: r for r in st.runs.values()}
        assert set(runs) == {"1", "2"} and all(
            r.inputs["base_sha"] == repo.rev("main") for r in runs.values()
        )

        # box-1 answers #1 honestly; a rogue box answers #2 with a verdict signed by a key nobody listed
        main = repo.rev("main")
        honest = measurements(rules, head=st.pulls[1].head_sha, base=main, pr=1, gain=1.06)
        play_runner(github_double, runs["1"].id, artifact_files(rules, m=honest))
        forged = measurements(rules, head=st.pulls[2].head_sha, base=main, pr=2, gain=1.5)
        play_runner(github_double, runs["2"].id, artifact_files(rules, key=ROGUE_KEY, m=forged), box="rogue")

        second = bot.poll_once()
        assert second.evaluated == [1], second
        assert any(n.startswith("ALERT #2") for n in second.notes), second.notes
        verdict_1 = store.queue.evaluations(pr=1, state="done")[-1].verdict
        assert verdict_1.status.value == "PASS" and verdict_1.tier is not None
        body_1 = next(c.body for c in st.comments_on(1) if c.author == BOT)
        assert MARKER in body_1 and "PASS" in body_1
        verdict_2 = store.queue.evaluations(pr=2, state="done")[-1].verdict
        assert verdict_2.status.value == "INFRA_ERROR" and verdict_2.tier is None
        body_2 = next(c.body for c in st.comments_on(2) if c.author == BOT)
        assert "infra error" in body_2 and "PASS" not in body_2
        assert "infra-error" in gh.get_pull(2).labels and "verified" not in gh.get_pull(2).labels


# --- which profile a PR is judged on is policy: the rules' dispatch.profile ------------------------------


def _actions_rules_dir(tmp_path, profile: str):
    """The shipped rules in actions mode, judging PRs on `profile`, as a maintainer would write them."""
    import shutil

    d = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), d)
    text = (d / "dispatch.yaml").read_text()
    for old, new in (("mode: local", "mode: actions"), ("profile: cpu", f"profile: {profile}"),
                     ("runner_public_keys: []", f"runner_public_keys: ['{public_b64(RUNNER_KEY)}']")):  # fmt: skip
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (d / "dispatch.yaml").write_text(text)
    return d


def _adapter(github_double, fake_clock) -> PyGithubAdapter:
    """The bot's GitHub adapter on the double, on the fake clock."""
    return PyGithubAdapter.from_token(github_double.repo, "ghp_test", base_url=github_double.base_url, pace=False,
                                      timeout=2.0, rng=random.Random(0), sleep=fake_clock.sleep,
                                      clock=fake_clock.time)  # fmt: skip


def _contest(github_double, tmp_path):
    st = github_double.state
    st.add_workflow(WORKFLOW, run_name=RUN_NAME)
    repo = BareRepo.create(tmp_path / "remote.git", {"engine/model.py": "x = 1\n"}, when=st.now)
    st.clone_url = repo.url
    add_git_pull(st, repo, 1, {"engine/model.py": "x = 2  # faster\n"}, author_login="alice", body=BODY)
    return st


def test_a_bot_whose_rules_name_gpu_dispatches_gpu(github_double, fake_clock, tmp_path):
    """The bug this pins: the profile lived in the bot's settings, which no command set, so a GPU contest's
    PRs were all dispatched to be measured on the cpu profile."""
    st = _contest(github_double, tmp_path)
    rules = load_rules(_actions_rules_dir(tmp_path, "gpu"))
    gh = _adapter(github_double, fake_clock)
    with Store(tmp_path / "state.db") as store:
        bot = Bot(gh, store, rules, BotSettings(bot_login=BOT, work_dir=tmp_path / "work"),
                  Mirror(st.clone_url, tmp_path / "mirror.git"), None, lambda _: None)  # type: ignore[arg-type]  # fmt: skip
        bot.poll_once()
    (run,) = st.runs.values()
    assert run.inputs["profile"] == "gpu", run.inputs


def test_the_poll_command_exactly_as_the_shipped_workflow_writes_it_dispatches_what_the_rules_say(
    github_double, tmp_path, monkeypatch
):
    """The `evalbot poll` line of evalbot-poll.yml, expanded by bash as GitHub's runner does, run against
    the GitHub double with rules that judge PRs on gpu: it passes no profile, and gpu is dispatched."""
    import os
    import subprocess
    from pathlib import Path

    import yaml
    from click.testing import CliRunner

    from evalbot.cli import main
    from evalbot.cli import options as cli_options

    st = _contest(github_double, tmp_path)
    monkeypatch.setattr(cli_options, "default_rules_dir", lambda *_a: _actions_rules_dir(tmp_path, "gpu"))
    wf = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / ".github/workflows/evalbot-poll.yml").read_text()
    )
    (step,) = [s for s in wf["jobs"]["poll"]["steps"] if s.get("id") == "poll"]
    assert "--profile" not in step["run"]
    env = {"PATH": os.environ["PATH"], "GITHUB_API_URL": github_double.base_url, "RUNNER_TEMP": str(tmp_path)}
    argv = subprocess.run(["bash", "-c", "evalbot() { printf '%s\\0' \"$@\"; }\n" + step["run"]], env=env,
                          capture_output=True, text=True, check=True).stdout.split("\0")[:-1]  # fmt: skip
    assert argv[:2] == ["poll", "--once"], argv
    here = [
        "--git-remote",
        st.clone_url,
    ]  # on GitHub, the repository's own remote (github.com here is unreachable)
    result = CliRunner().invoke(main, [*argv, *here], catch_exceptions=False, env={
        "GITHUB_TOKEN": "ghp_t", "EVALBOT_REPO": github_double.repo,
        "EVALBOT_STATE": str(tmp_path / "state" / "state.db")})  # fmt: skip
    assert result.exit_code == 0, result.output
    (run,) = st.runs.values()
    assert run.inputs["profile"] == "gpu", run.inputs
