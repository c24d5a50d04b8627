"""The shipped workflows' run steps, executed as a GitHub runner executes them (#38, part 5): a checkout of the
repository, a fresh venv standing for actions/setup-python, the workflow's own non-editable install, each
`run:` step through `bash -e` with its `${{ }}` expressions filled in, the variables the runner sets
(RUNNER_TEMP, GITHUB_ENV, GITHUB_OUTPUT, GITHUB_API_URL, GITHUB_SERVER_URL...) and the GitHub double for
the API. `uses:` steps are played by the test: the checkout is a copy of the working tree, the cache misses,
and `gh` is a stand-in that finds no earlier run (the artifact restore then starts an empty store).

What these caught: the poll workflow installed `.[bot]` non-editable, so `default_rules_dir()` pointed into
site-packages, where there is no rules/, and its first evalbot step failed; and the wheel left out the
notices' templates, so an installed bot could not write a needs-benchmark comment. The eval workflow now
installs the harness non-editable too, and runs here as written (a PR that is SKIPPED before any build:
a measured evaluation through it runs on a GPU box, bench/calibrate_gpu_device.sh MODE=workflow).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.serve import serve

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


# ------------------------------------------------------------------ the runner's expression language


def evaluate(expr: str, ctx: dict[str, Any]) -> Any:
    """The part of GitHub's expression syntax the shipped workflows use: dotted names, '...' literals,
    ==, !=, &&, || (with JavaScript's value semantics: `a || b` is a if truthy), always()."""
    expr = expr.strip()
    for op in ("||", "&&"):
        parts = _split(expr, op)
        if len(parts) > 1:
            vals = [evaluate(p, ctx) for p in parts]
            if op == "||":
                return next((v for v in vals if v), vals[-1])
            return next((v for v in vals if not v), vals[-1])
    for op in ("!=", "=="):
        parts = _split(expr, op)
        if len(parts) == 2:
            a, b = (evaluate(p, ctx) for p in parts)
            return (str(a) != str(b)) if op == "!=" else (str(a) == str(b))
    if expr in ("always()", "true"):
        return True
    if expr == "false":
        return False
    if expr.startswith("'") and expr.endswith("'"):
        return expr[1:-1]
    value: Any = ctx
    for key in expr.split("."):
        value = value.get(key, "") if isinstance(value, dict) else ""
    return value


def _split(expr: str, op: str) -> list[str]:
    out, depth, quote, start, i = [], 0, False, 0, 0
    while i < len(expr):
        c = expr[i]
        if c == "'":
            quote = not quote
        elif not quote and c == "(":
            depth += 1
        elif not quote and c == ")":
            depth -= 1
        elif not quote and depth == 0 and expr.startswith(op, i):
            out.append(expr[start:i])
            start = i = i + len(op)
            continue
        i += 1
    return [*out, expr[start:]]


def fill(text: str, ctx: dict[str, Any]) -> str:
    return EXPR.sub(lambda m: str(evaluate(m.group(1), ctx)), text)


def test_the_expression_subset_behaves_as_githubs():
    ctx = {"inputs": {"x": ""}, "github": {"token": "T", "ref": "refs/heads/main"}, "secrets": {}}
    assert evaluate("secrets.EVALBOT_TOKEN || github.token", ctx) == "T"
    assert evaluate("github.ref == 'refs/heads/main' && vars.EVALBOT_PAUSED != 'true'", ctx) is True
    assert evaluate("inputs.x != '' || steps.cache.outputs.cache-matched-key == ''", ctx) is True
    assert fill("a ${{ github.token }} b", ctx) == "a T b"


# ------------------------------------------------------------------ a runner


class Runner:
    """One job's steps run as a GitHub-hosted runner runs them."""

    def __init__(
        self, tmp: Path, workspace: Path, python_bin: Path, env: dict[str, str], ctx: dict[str, Any]
    ):
        self.temp = tmp / "runner-temp"
        self.temp.mkdir()
        self.step_timeout_s = (
            600  # a measured evaluation through a job (bench/workflow_eval_cpu.py) takes more
        )
        self.workspace = workspace
        self.github_env = tmp / "github_env"
        self.github_env.touch()
        tools = tmp / "tools"
        tools.mkdir()
        gh = tools / "gh"  # the GitHub CLI, finding no earlier run and no artifact
        gh.write_text(
            '#!/bin/sh\ncase "$1 $2" in "run list") exit 0;; esac\necho "gh: not found" >&2; exit 1\n'
        )
        gh.chmod(0o755)
        self.env = {
            "PATH": f"{python_bin}:{tools}:/usr/bin:/bin",
            "HOME": str(tmp / "home"),
            "RUNNER_TEMP": str(self.temp),
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ENV": str(self.github_env),
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            **env,
        }
        self.ctx = {"runner": {"temp": str(self.temp)}, **ctx}
        self.log: list[str] = []

    def run_job(self, job: dict[str, Any], stop_after: str | None = None) -> None:
        assert evaluate(str(job.get("if", "true")), self.ctx) not in (False, ""), "the job would be skipped"
        for step in job["steps"]:
            if "uses" in step:
                continue  # played by the test: checkout, setup-python, cache (a miss), artifacts
            if "if" in step and not evaluate(step["if"], self.ctx):
                continue
            self.run_step(step)
            if stop_after and step.get("id") == stop_after:
                return

    def run_step(self, step: dict[str, Any]) -> None:
        output = self.temp / "github_output"
        output.write_text("")
        env = {**self.env, **{k: str(fill(str(v), self.ctx)) for k, v in (step.get("env") or {}).items()}}
        env["GITHUB_OUTPUT"] = str(output)
        script = fill(step["run"], self.ctx)
        res = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=self.workspace, env=env, capture_output=True, text=True, timeout=self.step_timeout_s,
        )  # fmt: skip
        name = step.get("name") or step["run"].splitlines()[0]
        self.log.append(f"$ {name}\n{res.stdout}{res.stderr}")
        assert res.returncode == 0, f"step {name!r} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        for line in self.github_env.read_text().splitlines():  # what a step exported, as the runner does
            key, _, value = line.partition("=")
            self.env[key] = value
        if step.get("id"):
            outs = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
            self.ctx.setdefault("steps", {})[step["id"]] = {"outputs": outs, "outcome": "success"}


def checkout(dest: Path) -> Path:
    """The repository as actions/checkout leaves it: its files (tracked, and new ones not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")  # fmt: skip
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not src.is_symlink():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def fresh_python(venv: Path) -> Path:
    """actions/setup-python's interpreter: a fresh venv, no evalbot in it; its bin folder. Its third-party
    packages are this test environment's (a .pth), so a workflow's install finds them satisfied offline."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Python 3.11's venv seeds a setuptools too old to build a wheel: the build uses this environment's
    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True)
    site = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    (Path(site) / "_test_env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin"


@pytest.fixture(scope="module")
def setup_python(tmp_path_factory) -> Path:
    return fresh_python(tmp_path_factory.mktemp("setup-python") / "venv")


def poll_runner(tmp_path: Path, double, workspace: Path, python_bin: Path) -> Runner:
    """A runner for evalbot-poll.yml against the double, whose contest has one open PR (#1) and the
    evaluation workflow to dispatch it to."""
    from tests.evalbot.test_dispatch import RUN_NAME, WORKFLOW
    from tests.evalbot.test_poller_actions import BODY

    st = double.state
    st.add_workflow(WORKFLOW, run_name=RUN_NAME)
    server = tmp_path / "server"  # GITHUB_SERVER_URL: where the runner's git finds owner/name.git
    repo = BareRepo.create(server / f"{double.repo}.git", {"engine/model.py": "x = 1\n"}, when=st.now)
    st.clone_url = repo.url
    add_git_pull(st, repo, 1, {"engine/model.py": "x = 2  # faster\n"}, author_login="alice", body=BODY)
    return Runner(
        tmp_path, workspace, python_bin,
        {"GITHUB_API_URL": double.base_url, "GITHUB_SERVER_URL": server.as_uri(),
         "GITHUB_REPOSITORY": double.repo, **OFFLINE_PIP},
        {"github": {"token": "ghs_job", "ref": "refs/heads/main", "repository": double.repo},
         "inputs": {"restore_from_run": "", "start_empty": "false"}, "secrets": {}, "vars": {},
         "steps": {"cache": {"outputs": {"cache-matched-key": ""}}}},
    )  # fmt: skip


OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_the_poll_workflow_runs_as_written_from_its_non_editable_install(tmp_path, setup_python):
    """evalbot-poll.yml's steps, one after the other, against the GitHub double: the install (non-editable),
    the refusal of local mode, the state, the artifact restore (none: an empty store), and the poll, which
    dispatches the open PR's evaluation to evalbot-eval.yml."""
    from tests.evalbot.test_poller_actions import _actions_rules_dir

    workspace = checkout(tmp_path / "workspace")
    # the contest's maintainer put its rules in actions mode, with the runner's public key
    shutil.copy(_actions_rules_dir(tmp_path, "cpu") / "dispatch.yaml", workspace / "rules" / "dispatch.yaml")
    wf = yaml.safe_load((WORKFLOWS / "evalbot-poll.yml").read_text())
    with serve() as double:
        st = double.state
        runner = poll_runner(tmp_path, double, workspace, setup_python)
        runner.run_job(wf["jobs"]["poll"])
        log = "\n".join(runner.log)
        # the install is not editable: evalbot runs from site-packages, the rules from the checkout
        shown = subprocess.run([setup_python / "python", "-c", "import evalbot; print(evalbot.__file__)"],
                               cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "site-packages" in shown and str(workspace) not in shown, shown
        assert "no saved store: starting from an empty one" in log
        (run,) = st.runs.values()
        assert run.inputs["pr"] == "1" and run.inputs["profile"] == "cpu", run.inputs
        assert (Path(runner.env["EVALBOT_STATE"])).is_file()  # the store the artifact step would save


def test_the_poll_workflow_refuses_local_mode_from_its_non_editable_install(tmp_path, setup_python):
    """The shipped rules say `mode: local`: the poll's guard step must read them (from the checkout, not
    site-packages) and stop the job with its own error before any PR is touched."""
    workspace = checkout(tmp_path / "workspace")
    wf = yaml.safe_load((WORKFLOWS / "evalbot-poll.yml").read_text())
    runner = Runner(tmp_path, workspace, setup_python, dict(OFFLINE_PIP),
                    {"github": {"token": "t", "ref": "refs/heads/main"}, "secrets": {}, "vars": {}})  # fmt: skip
    with pytest.raises(AssertionError) as info:
        runner.run_job(wf["jobs"]["poll"])
    assert "this workflow runs only in 'actions' mode" in str(info.value), str(info.value)
    assert "expected a directory of rules files" not in str(info.value)


def test_the_pages_workflow_builds_the_dashboard_as_written_from_its_non_editable_install(
    tmp_path, setup_python
):
    """pages.yml's build job: its install (the bot and matplotlib, non-editable), no saved store yet (the
    cache misses), so an empty store, and `evalbot dashboard build` reading the ledgers from the
    repository's git remote: the site's index is written."""
    workspace = checkout(tmp_path / "workspace")
    server = tmp_path / "server"
    BareRepo.create(server / "contest/engine.git", {"engine/model.py": "x = 1\n"}, when=1_700_000_000)
    wf = yaml.safe_load((WORKFLOWS / "pages.yml").read_text())
    runner = Runner(
        tmp_path, workspace, setup_python,
        {"GITHUB_SERVER_URL": server.as_uri(), "GITHUB_REPOSITORY": "contest/engine", **OFFLINE_PIP},
        {"github": {"token": "ghs_job", "ref": "refs/heads/main", "run_id": "7"}, "secrets": {}, "vars": {},
         "steps": {"cache": {"outputs": {"cache-matched-key": ""}}}},
    )  # fmt: skip
    runner.run_job(wf["jobs"]["build"])
    log = "\n".join(runner.log)
    assert "building the dashboard from an empty one" in log
    assert (workspace / "site" / "index.html").is_file(), log


def test_the_wheel_carries_every_template_and_data_file_of_evalbot(tmp_path):
    """A non-editable install has only what the wheel carries: every template (the notices' folder was
    missing, so an installed bot could not write a needs-benchmark comment) and every prompt corpus."""
    import zipfile

    env = {**os.environ, **OFFLINE_PIP}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, env=env, capture_output=True, cwd=tmp_path)  # fmt: skip
    (wheel,) = tmp_path.glob("evalbot-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        str(p.relative_to(ROOT))
        for folder in ("evalbot/templates", "evalbot/data")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")
    }
    assert wanted and sorted(wanted - shipped) == []
    assert "evalbot/evaluate/gpu_probe.py" in shipped  # the GPU idle probe, run by its path
    assert (
        "evalbot/reference/llama.py" in shipped and "evalbot/reference/__main__.py" in shipped
    )  # the reference
    # evalbot only (#38): a contest's own `engine` package is never shadowed by one the judge installed
    assert {n.split("/")[0].split("-")[0] for n in shipped} == {"evalbot"}, sorted(
        {n.split("/")[0] for n in shipped}
    )


def test_the_eval_workflow_runs_as_written_and_signs_what_it_decided(tmp_path, setup_python):
    """evalbot-eval.yml's steps on a self-hosted runner: the inputs checked, the PR's head fetched as
    objects, the harness installed into a venv on the box's interpreter (not editable), `evalbot evaluate`
    from a neutral folder under the box lock with the checkout's rules and the runner's key. The PR edits
    the rules, so it is SKIPPED before anything is built: a decided result the workflow passes (exit 0), its
    receipt signed by the runner's key."""
    workspace = tmp_path / "workspace"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(workspace)], check=True)
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "checkout", "-q", "-B", "main"], check=True)
    for path in ("rules", "evalbot", "tests", ".github", "pyproject.toml"):  # the working tree, as committed
        src, dst = ROOT / path, workspace / path
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "main", "--allow-empty"], check=True)
    base = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([*git, "checkout", "-q", "-b", "pr"], check=True)
    (workspace / "rules" / "gates.yaml").write_text(
        (workspace / "rules" / "gates.yaml").read_text() + "\n# looser\n"
    )
    subprocess.run([*git, "commit", "-qam", "loosen the gates"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # the GitHub remote: the PR's head under refs/pull/1/head, as GitHub keeps it; the checkout is base_sha
    remote = tmp_path / "server" / "contest" / "engine.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(workspace), str(remote)], check=True)
    subprocess.run(["git", "-C", str(remote), "update-ref", "refs/pull/1/head", head], check=True)
    subprocess.run(["git", "-C", str(remote), "branch", "-q", "-D", "pr"], check=True)
    subprocess.run([*git, "checkout", "-q", "--detach", base], check=True)
    subprocess.run([*git, "branch", "-q", "-D", "pr"], check=True)
    subprocess.run([*git, "remote", "set-url", "origin", remote.as_uri()], check=True)
    # the runner's key, in its environment as the README's operators' section says
    key, pub = tmp_path / "runner-key.pem", tmp_path / "runner-key.pub"
    subprocess.run([sys.executable, "-m", "evalbot", "receipt", "keygen", str(key), str(pub)], check=True,
                   capture_output=True, cwd=ROOT)  # fmt: skip
    wf = yaml.safe_load((WORKFLOWS / "evalbot-eval.yml").read_text())
    inputs = {"pr": "1", "head_sha": head, "base_sha": base, "profile": "cpu", "request_id": "req-0000abcd",
              "exclude_runner": "", "box": ""}  # fmt: skip
    summary = tmp_path / "step_summary.md"
    # pip's build isolation would fetch a setuptools from PyPI for the install; offline, the venv's own
    # (Python 3.11 seeds one too old to build a wheel) is shadowed by this environment's
    tools = tmp_path / "buildtools"
    tools.mkdir()
    purelib = Path(sysconfig.get_path("purelib"))
    for name in ("setuptools", "_distutils_hack", *(p.name for p in purelib.glob("setuptools-*.dist-info"))):
        (tools / name).symlink_to(purelib / name)
    offline_build = {"PYTHONPATH": str(tools)}
    runner = Runner(
        tmp_path, workspace, setup_python,
        {"GITHUB_SERVER_URL": (tmp_path / "server").as_uri(), "GITHUB_REPOSITORY": "contest/engine",
         "RUNNER_NAME": "box-1", "EVALBOT_RUNNER_KEY_FILE": str(key), "EVALBOT_PYTHON": sys.executable,
         "EVALBOT_LOCK_FILE": str(tmp_path / "eval.lock"), "GITHUB_STEP_SUMMARY": str(summary), **OFFLINE_PIP,
         **offline_build},
        {"github": {"token": "ghs_job"}, "inputs": inputs, "secrets": {}, "vars": {}},
    )  # fmt: skip
    runner.run_job(wf["jobs"]["evaluate"])
    out = Path(runner.temp) / "evalbot-out"
    result = json.loads((out / "result.json").read_text())
    assert result["verdict"]["status"] == "SKIPPED" and "rules/gates.yaml" in result["verdict"]["reasons"][0]
    assert runner.ctx["steps"]["evaluate"]["outputs"]["status"] == "4"
    assert "SKIPPED" in summary.read_text()  # the report, in the job's summary
    installed = Path(runner.temp) / "evalbot-venv" / "bin"
    shown = subprocess.run([installed / "python", "-c", "import evalbot; print(evalbot.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "site-packages" in shown and str(workspace) not in shown, shown
    # both sides' builds layer on this venv: the setuptools they build with is the box's, not the one
    # Python 3.11's venv seeds (65.5, no bdist_wheel: every engine build failed through the workflow)
    tools_at = subprocess.run([installed / "python", "-c", "import setuptools; print(setuptools.__file__)"],
                              cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "evalbot-venv" not in tools_at, tools_at
    verify = subprocess.run([installed / "evalbot", "receipt", "verify", str(out / "receipt.json"), "--key", str(pub)],
                            capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_init_sets_a_contest_up_whose_workflows_install_the_pinned_evalbot(tmp_path, setup_python):
    """`evalbot init` from a non-editable install writes the rules, the PR template and the workflows
    into a contest repository that holds no evalbot; its poll workflow then installs the pinned evalbot
    (here a file URL to this checkout), reads the contest's own rules, and dispatches the open PR."""
    from tests.evalbot.test_poller_actions import _actions_rules_dir

    env = {**os.environ, **OFFLINE_PIP}
    subprocess.run([setup_python / "python", "-m", "pip", "install", "-q", str(ROOT)], check=True, env=env,
                   capture_output=True, cwd=tmp_path)  # fmt: skip
    contest = tmp_path / "contest"
    (contest / "myengine").mkdir(parents=True)
    (contest / "myengine" / "__init__.py").write_text("")
    spec = f"evalbot @ {ROOT.as_uri()}"
    init = [setup_python / "evalbot", "init", str(contest), "--evalbot", spec]
    got = subprocess.run(init, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert got.returncode == 0, got.stdout + got.stderr
    poll = (contest / ".github" / "workflows" / "evalbot-poll.yml").read_text()
    assert f"'evalbot[bot] @ {ROOT.as_uri()}'" in poll and "'.[bot]'" not in poll
    for name in ("evalbot-eval.yml", "pages.yml"):
        assert "'.[bot]'" not in (contest / ".github" / "workflows" / name).read_text()
    assert (contest / "rules" / "engine.yaml").is_file() and (
        contest / ".github" / "PULL_REQUEST_TEMPLATE.md"
    ).is_file()
    again = subprocess.run(init, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert again.returncode != 0 and "pass --force" in again.stderr  # nothing overwritten unasked
    bad = subprocess.run([*init[:-1], "evilpkg==1.0"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode != 0 and "a pip requirement for evalbot" in bad.stderr

    shutil.copy(_actions_rules_dir(tmp_path, "cpu") / "dispatch.yaml", contest / "rules" / "dispatch.yaml")
    assert not (contest / "evalbot").exists() and not (contest / "pyproject.toml").exists()
    wf = yaml.safe_load(poll)
    with serve() as double:
        st = double.state
        (tmp_path / "job").mkdir()
        fresh = tmp_path / "fresh-python"
        runner = poll_runner(tmp_path / "job", double, contest, fresh_python(fresh))
        runner.run_job(wf["jobs"]["poll"])
        (run,) = st.runs.values()
        assert run.inputs["pr"] == "1", run.inputs
        shown = subprocess.run([fresh / "bin" / "python", "-c", "import evalbot; print(evalbot.__file__)"],
                               cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert shown.startswith(str(fresh)), shown  # the pinned evalbot, installed by the workflow
