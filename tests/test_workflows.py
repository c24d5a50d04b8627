"""The GitHub Actions workflows: actionlint passes, and the safety properties hold as parsed YAML.

What matters most: no workflow runs PR code with secrets or a write token. So no pull_request_target,
CI gets a read-only token and no secrets, the poll (which holds the write token) never checks out a PR,
and the evaluation (which runs PR code, sandboxed) runs on self-hosted boxes from the trusted base.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalbot import dispatch
from evalbot.rules import default_rules_dir, load_rules

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
NAMES = ("ci.yml", "evalbot-poll.yml", "evalbot-eval.yml", "pages.yml")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def code(name: str) -> str:
    """The workflow's text without its comment lines (which explain, and so name, what must not be used)."""
    lines = (WORKFLOWS / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def triggers(wf: dict[str, Any]) -> dict[str, Any]:
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on


def steps(wf: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


def checkouts(wf: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in steps(wf) if str(s.get("uses", "")).startswith("actions/checkout@")]


def actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


@pytest.mark.skipif(actionlint() is None, reason="actionlint is not installed (the dev extra brings it)")
def test_actionlint_passes():
    proc = subprocess.run([actionlint(), *(str(WORKFLOWS / n) for n in NAMES)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_four_workflows_and_no_others_exist():
    assert sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_no_workflow_uses_pull_request_target(name):
    assert "pull_request_target" not in triggers(load(name))
    assert "pull_request_target" not in code(name)


@pytest.mark.parametrize("name", NAMES)
def test_every_job_has_a_timeout_and_a_least_privilege_default(name):
    wf = load(name)
    assert wf["permissions"] == {"contents": "read"} or name == "evalbot-poll.yml"
    for job_name, job in wf["jobs"].items():
        assert isinstance(job.get("timeout-minutes"), int), f"{name}: job {job_name} has no timeout"


def test_ci_runs_make_test_read_only_without_secrets():
    wf = load("ci.yml")
    text = code("ci.yml")
    assert set(triggers(wf)) == {"push", "pull_request"}
    assert wf["permissions"] == {"contents": "read"}
    assert "secrets." not in text and "secrets:" not in text and "github.token" not in text
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] == 90
    assert any(s.get("run") == "bash .ci/run" for s in job["steps"])
    assert all(c.get("with", {}).get("persist-credentials") is False for c in checkouts(wf))
    cached = [s["with"]["path"] for s in job["steps"] if str(s.get("uses", "")).startswith("actions/cache@")]
    assert set(cached) == {"~/.cache/pip", "~/.cache/evalbot/models"}
    assert "rules/models.yaml" in text  # the models' cache key comes from their pinned sha256s


def test_the_poll_never_checks_out_a_pr_and_never_overlaps():
    wf = load("evalbot-poll.yml")
    text = code("evalbot-poll.yml")
    assert set(triggers(wf)) == {"schedule", "workflow_dispatch"}
    cos = checkouts(wf)
    assert cos and all(c["with"]["ref"] == "main" and c["with"]["persist-credentials"] is False for c in cos)
    assert "refs/pull" not in text and "github.head_ref" not in text and "pull_request" not in text
    assert wf["concurrency"]["cancel-in-progress"] is False
    perms = wf["permissions"]
    for scope in ("pull-requests", "issues", "contents", "statuses", "actions"):
        assert perms[scope] == "write"
    assert any("evalbot poll --once" in s.get("run", "") for s in steps(wf))
    # the guard against local evaluation runs before the poll
    runs = [s.get("run", "") for s in steps(wf)]
    guard = next(i for i, r in enumerate(runs) if "dispatch.mode" in r)
    assert guard < next(i for i, r in enumerate(runs) if "evalbot poll" in r)


def test_the_poll_carries_its_state_with_a_unique_key_and_a_prefix_restore():
    wf = load("evalbot-poll.yml")
    restore = next(s for s in steps(wf) if str(s.get("uses", "")).startswith("actions/cache/restore@"))
    save = next(s for s in steps(wf) if str(s.get("uses", "")).startswith("actions/cache/save@"))
    assert "github.run_id" in restore["with"]["key"] and restore["with"]["key"] == save["with"]["key"]
    assert restore["with"]["restore-keys"] == "evalbot-state-"
    assert save["with"]["path"] == restore["with"]["path"] and "always()" in save["if"]
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact@") for s in steps(wf))
    assert "EVALBOT_STATE" in (WORKFLOWS / "evalbot-poll.yml").read_text()


def _labels(runs_on: Any) -> list[list[str]]:
    """Every label list a runs-on can resolve to (a list, or the JSON lists inside a fromJSON expression)."""
    if isinstance(runs_on, list):
        return [runs_on]
    return [json.loads(lit.replace("{0}", "box")) for lit in re.findall(r"'(\[[^']*\])'", runs_on)]


def test_the_evaluation_runs_both_sides_in_one_job_on_a_self_hosted_box_from_the_base():
    wf = load("evalbot-eval.yml")
    text = code("evalbot-eval.yml")
    assert set(triggers(wf)) == {"workflow_dispatch"}
    (job,) = wf["jobs"].values()  # one job: base and head measured on the same box
    options = _labels(job["runs-on"])
    assert len(options) == 2 and all({"self-hosted", "gpu-eval"} <= set(labels) for labels in options)
    assert "self-hosted" in job["runs-on"] and "ubuntu" not in job["runs-on"]
    assert job["concurrency"]["cancel-in-progress"] is False
    assert "runner.name" not in job["concurrency"]["group"]  # unknown until a runner takes the job
    (co,) = checkouts(wf)
    assert co["with"] == {"ref": "${{ inputs.base_sha }}", "fetch-depth": 0, "persist-credentials": False}
    assert "refs/pull/${PR}/head" in text
    (evaluate,) = [s for s in job["steps"] if s.get("id") == "evaluate"]
    assert 'bin/evalbot" evaluate' in evaluate["run"]
    assert "--base" in evaluate["run"] and "--head" in evaluate["run"] and "--key" in evaluate["run"]
    assert "flock" in evaluate["run"]  # one measurement per box at a time
    # no secrets and a read-only token in the job that runs PR code
    assert "secrets." not in text and wf["permissions"] == {"contents": "read"}
    assert "EVALBOT_RUNNER_KEY_FILE" in text


def test_the_evaluation_meets_the_dispatchers_contract():
    wf = load("evalbot-eval.yml")
    inputs = triggers(wf)["workflow_dispatch"]["inputs"]
    request_id = "evalbot-7-aaaaaaaaaaaa-1-0123abcd"
    req = dispatch.DispatchRequest(7, "a" * 40, "b" * 40, "gpu", "c" * 64, request_id)
    sent = dispatch.workflow_inputs(req)
    assert set(sent) <= set(inputs)  # GitHub refuses a dispatch with an input the workflow does not declare
    assert all(inputs[k].get("required") for k in sent if k != "exclude_runner")
    assert not any(v.get("required") for k, v in inputs.items() if k not in sent)
    # the dispatcher finds its run by the request id as a whitespace-separated word of the run name
    assert re.search(r"(^|\s)\$\{\{ inputs\.request_id \}\}(\s|$)", wf["run-name"])
    (upload,) = [s for s in steps(wf) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload["with"]["name"] == dispatch.ARTIFACT_PREFIX + "${{ inputs.request_id }}"
    files = {Path(p).name for p in upload["with"]["path"].splitlines() if p.strip()}
    assert files == {dispatch.RESULT_FILE, dispatch.RECEIPT_FILE, "report.md"}
    assert "always()" in upload["if"]
    d = load_rules(default_rules_dir()).dispatch
    assert (WORKFLOWS / d.workflow).is_file() and d.workflow == "evalbot-eval.yml"
    assert wf["jobs"]["evaluate"]["timeout-minutes"] < d.timeout_minutes


def test_pages_deploys_with_only_the_pages_permissions_and_no_secrets():
    wf = load("pages.yml")
    text = code("pages.yml")
    assert set(triggers(wf)) == {"schedule", "workflow_dispatch"}
    assert "secrets." not in text
    assert wf["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert "evalbot dashboard build --out site" in text
    uses = [str(s.get("uses", "")) for s in steps(wf)]
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    assert not any(u.startswith("actions/cache/save@") for u in uses)  # reads the store, never saves it
    assert all(c["with"]["ref"] == "main" for c in checkouts(wf))
