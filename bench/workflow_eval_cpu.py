"""A measured evaluation through .github/workflows/evalbot-eval.yml, as a self-hosted runner runs it, on CPU:

    .venv/bin/python bench/workflow_eval_cpu.py OUT_DIR PROFILE PATCH [BASE_PATCH]

The contest is this checkout (main, with BASE_PATCH where given) and one PR, main plus PATCH (a demo
patch), kept by a bare "GitHub" remote under refs/pull/1/head. The job's steps run one after the other
through tests/test_workflow_runs.py's Runner: the inputs checked, the PR's head fetched as objects, the
harness installed non-editable into a venv on the box's interpreter, `evalbot evaluate` from a neutral
folder under the box lock with the checkout's rules and the runner's key; the models come from the box's
cache ($EVALBOT_CACHE, else ~/.cache/evalbot), as a self-hosted runner keeps it. Writes OUT_DIR/result.json,
report.md, receipt.json, the steps' log (workflow.log) and the job's summary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_workflow_runs import OFFLINE_PIP, WORKFLOWS, Runner, fresh_python  # noqa: E402


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=contributor", "-c", "user.email=c@example.invalid",
                           *args], check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip


def main(out: Path, profile: str, patch: Path, base_patch: Path | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(subprocess.run(["mktemp", "-d", "/tmp/wf-eval.XXXX"], capture_output=True, text=True,
                              check=True).stdout.strip())  # fmt: skip
    workspace = tmp / "workspace"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(workspace)], check=True)
    git(workspace, "checkout", "-q", "-B", "main")
    if base_patch is not None:
        git(workspace, "am", "-q", str(base_patch.resolve()))
    base = git(workspace, "rev-parse", "HEAD")
    git(workspace, "checkout", "-q", "-b", "pr")
    git(workspace, "am", "-q", str(patch.resolve()))
    head = git(workspace, "rev-parse", "HEAD")
    remote = tmp / "server" / "contest" / "engine.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(workspace), str(remote)], check=True)
    git(remote, "update-ref", "refs/pull/1/head", head)
    git(remote, "branch", "-q", "-D", "pr")
    git(workspace, "checkout", "-q", "--detach", base)
    git(workspace, "branch", "-q", "-D", "pr")
    git(workspace, "remote", "set-url", "origin", remote.as_uri())
    key, pub = tmp / "runner-key.pem", tmp / "runner-key.pub"
    subprocess.run([sys.executable, "-m", "evalbot", "receipt", "keygen", str(key), str(pub)], check=True,
                   capture_output=True, cwd=ROOT)  # fmt: skip
    wf = yaml.safe_load((WORKFLOWS / "evalbot-eval.yml").read_text())
    inputs = {"pr": "1", "head_sha": head, "base_sha": base, "profile": profile, "request_id": "req-bench001",
              "exclude_runner": "", "box": ""}  # fmt: skip
    summary = tmp / "step_summary.md"
    tools = tmp / "buildtools"  # offline: the build's setuptools is this environment's (as the test does)
    tools.mkdir()
    purelib = Path(sysconfig.get_path("purelib"))
    for name in ("setuptools", "_distutils_hack", *(p.name for p in purelib.glob("setuptools-*.dist-info"))):
        (tools / name).symlink_to(purelib / name)
    runner = Runner(
        tmp, workspace, fresh_python(tmp / "setup-python"),
        {"GITHUB_SERVER_URL": (tmp / "server").as_uri(), "GITHUB_REPOSITORY": "contest/engine",
         "RUNNER_NAME": "box-1", "EVALBOT_RUNNER_KEY_FILE": str(key), "EVALBOT_PYTHON": sys.executable,
         "EVALBOT_LOCK_FILE": str(tmp / "eval.lock"), "GITHUB_STEP_SUMMARY": str(summary), **OFFLINE_PIP,
         "PYTHONPATH": str(tools),
         # the box's model cache, warm as a self-hosted runner keeps it (the runner's HOME is a fresh one)
         "EVALBOT_CACHE": os.environ.get("EVALBOT_CACHE", str(Path.home() / ".cache" / "evalbot"))},
        {"github": {"token": "ghs_job"}, "inputs": inputs, "secrets": {}, "vars": {}},
    )  # fmt: skip
    runner.step_timeout_s = 3 * 3600  # the job's own limit is the workflow's timeout-minutes
    t0 = time.monotonic()
    status = 0
    try:
        runner.run_job(wf["jobs"]["evaluate"])
    except AssertionError as exc:  # a step failed: its output is in the log
        status = 1
        runner.log.append(str(exc))
    (out / "workflow.log").write_text("\n".join(runner.log) + f"\njob: {time.monotonic() - t0:.0f} s\n")
    done = Path(runner.temp) / "evalbot-out"
    for name in ("result.json", "report.md", "receipt.json"):
        if (done / name).exists():
            shutil.copy2(done / name, out / name)
    if summary.exists():
        shutil.copy2(summary, out / "summary.md")
    installed = Path(runner.temp) / "evalbot-venv" / "bin"
    if (out / "receipt.json").exists():
        verify = subprocess.run([installed / "evalbot", "receipt", "verify", str(out / "receipt.json"), "--key",
                                 str(pub)], capture_output=True, text=True)  # fmt: skip
        (out / "workflow.log").open("a").write(f"receipt verify: exit {verify.returncode}: {verify.stdout}")
    if (out / "result.json").exists():
        v = json.loads((out / "result.json").read_text())["verdict"]
        print(f"{v['status']} {v.get('tier')}: {v['reasons'][:2]}")
    print(f"job {'passed' if status == 0 else 'failed'} in {time.monotonic() - t0:.0f} s; {out}")
    return status


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    bp = Path(sys.argv[4]) if len(sys.argv) == 5 else None
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), bp))
