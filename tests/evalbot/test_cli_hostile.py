"""The maintainer CLI takes only good input: every bad input is a one-line error and a non-zero exit, no
traceback, nothing changed. Run as subprocesses, as a maintainer runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.github_double.gitrepo import BareRepo, add_git_pull

pytest_plugins = ["tests.github_double.fixture"]

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "copycat"


def evalbot(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "evalbot", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or ROOT,
        timeout=120,
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 or (lines and lines[0].startswith("Usage:") and len(lines) <= 3), out
    return out


@pytest.mark.parametrize("login", ["../x", "a b", "-x", "a" * 200, "alice#x", "bob\nalice", ""])
@pytest.mark.parametrize("command", ["block", "unblock"])
def test_block_takes_only_github_logins(tmp_path, command, login):
    state = tmp_path / "state.db"
    proc = evalbot(
        command,
        "--state",
        str(state),
        "--git-remote",
        (tmp_path / "none.git").as_uri(),
        "--dry-run",
        "--",
        login,
    )
    out = one_line_error(proc)
    assert "not a GitHub login" in out or "Missing argument" in out
    assert "would" not in proc.stdout  # the plan is printed only after the input is valid
    assert not state.exists()  # nothing changed, not even a new store


def test_a_bad_name_in_the_ledger_is_reported_and_skipped_never_fatal(tmp_path):
    from evalbot.ledgers import BLOCKED_PATH, commit_ledgers, read_ledgers

    remote = tmp_path / "ledgers.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    commit_ledgers(remote.as_uri(), {BLOCKED_PATH: "mallory\n../x # hand edit\n"}, "seed")
    proc = evalbot("block", "eve", "--state", str(tmp_path / "state.db"), "--git-remote", remote.as_uri())
    assert proc.returncode == 0, proc.stderr
    text = read_ledgers(remote.as_uri())[BLOCKED_PATH]
    assert "eve" in text and "mallory" in text


def test_clear_without_a_reason_is_refused_before_anything(tmp_path):
    proc = evalbot("clear", "1", "--reason", "  ", "--state", str(tmp_path / "s.db"), "--repo", "o/r")
    assert "must say why" in one_line_error(proc)


@pytest.fixture
def gh_env(github_double, tmp_path):
    st = github_double.state
    repo = BareRepo.create(tmp_path / "remote.git", {"README.md": "r\n"}, when=st.now)
    add_git_pull(st, repo, 1, {"engine/x.py": "x = 1\n"}, author_login="alice")
    env = {"GITHUB_TOKEN": "ghp_test"}
    args = [
        "--repo",
        github_double.repo,
        "--api-url",
        github_double.base_url,
        "--state",
        str(tmp_path / "s.db"),
        "--git-remote",
        repo.url,
    ]
    return env, args


@pytest.mark.parametrize(
    "command", [["clear", "999", "--reason", "looked"], ["rerun", "999"], ["hold", "999"]]
)
def test_commands_on_a_pr_that_does_not_exist(gh_env, command, tmp_path):
    env, args = gh_env
    proc = evalbot(*command, *args, env=env)
    assert "no such pull request" in one_line_error(proc)
    assert not (tmp_path / "s.db").exists() or command[0] == "hold"


def test_render_on_wrong_types_and_deep_nesting(tmp_path):
    bad = tmp_path / "types.json"
    bad.write_text(json.dumps({"measurements": {"provenance": 5}, "verdict": {"status": []}}))
    assert "types.json" in one_line_error(evalbot("render", "--verdict", str(bad)))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(evalbot("render", "--verdict", str(deep)))
    nested = tmp_path / "nested.json"
    nested.write_text('{"measurements": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + ', "verdict": {}}')
    one_line_error(evalbot("render", "--verdict", str(nested)))


@pytest.mark.parametrize(
    "rows", ["1e-308,1e308\n1e308,1e-308\n", "1e308,1e308\n1e-308,1e308\n1,1\n", "0,1\n1,1\n", "nan,1\n1,1\n"]
)
def test_stats_on_extreme_numbers(tmp_path, rows):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("base,head\n" + rows)
    one_line_error(evalbot("stats", "--pairs", str(pairs)))


def test_rules_check_on_5000_deep_yaml(tmp_path):
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "gates.yaml").write_text(
        (rules / "gates.yaml").read_text() + "x: " + "[" * 5000 + "]" * 5000 + "\n"
    )
    assert "nested deeper" in one_line_error(evalbot("rules", "check", str(rules)))
    (rules / "gates.yaml").write_text("a:\n" + "".join("  " * i + "b:\n" for i in range(1, 5000)))
    one_line_error(evalbot("rules", "check", str(rules)))


def test_worker_ids_differ_between_processes():
    code = "from evalbot.poller import BotSettings; print(BotSettings().worker)"
    ids = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout
        for _ in range(3)
    }
    assert len(ids) == 3


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00" + b"\x10\x00" + b"\x00" * 82])
def test_an_empty_or_truncated_state_file_is_refused_not_replaced(tmp_path, content):
    state = tmp_path / "state.db"
    state.write_bytes(content)
    out = one_line_error(evalbot("status", "--state", str(state)))
    assert "empty" in out or "truncated" in out
    assert state.read_bytes() == content  # left untouched


def test_copycat_scan_finds_the_copies_in_a_folder_of_diffs(tmp_path):
    folder = tmp_path / "ring"
    folder.mkdir()
    for number, author in ((23, "ann"), (26, "ben"), (30, "cid"), (62, "dan"), (63, "eve")):
        shutil.copy(CORPUS / "prs" / f"{number:04d}.patch", folder / f"{number:04d}-{author}.diff")
    proc = evalbot("copycat", "scan", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["number"]: r for r in json.loads(proc.stdout)}
    assert rows[63]["band"] == "copycat" and rows[63]["original"] == 26 and rows[63]["containment"] > 0.9
    assert rows[62]["band"] in ("copycat", "copycat-warn") and rows[62]["original"] == 23
    assert rows[23]["band"] == "clean" and rows[23]["original"] is None
    text = evalbot("copycat", "scan", str(folder))
    assert text.returncode == 0 and "#0063 eve" in text.stdout and "#0026" in text.stdout
    (folder / "oops.diff").write_text("x")
    assert "NNNN-author.diff" in one_line_error(evalbot("copycat", "scan", str(folder)))
