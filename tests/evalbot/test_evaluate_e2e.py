"""`evalbot evaluate` end to end, on clones of this repository, for the outcomes decided before any
engine process runs: skipped sensitive edits, a broken build (REJECT with its log), main broken too
(INFRA_ERROR), an unknown revision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Nothing here reads the A/B's numbers closely: each test checks what noise cannot move (a skip, a build, the
# sandbox, a correctness gate), with a quiet-box guard that lets it run beside the rest of the suite.
LOOSE_QUIET = """\
  quiet:
    max_other_cores: 64
    max_gpu_util: 5
    sample_s: 0.25
    max_wait_s: 60
"""

ROOT = Path(__file__).resolve().parents[2]
# builds both sides; the runs on the shipped rules fetch the real model and use llama.cpp
pytestmark = pytest.mark.e2e


def _repo_with_branch(tmp_path: Path, path: str, text: str, break_main: str | None = None) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "checkout", "-q", "-B", "main"], check=True)
    if break_main:  # main itself gets the same damage: then nobody's PR is to blame
        (repo / break_main).write_text((repo / break_main).read_text() + text)
        subprocess.run([*git, "commit", "-qam", "main breaks"], check=True)
    subprocess.run([*git, "checkout", "-q", "-b", "pr"], check=True)
    target = repo / path
    target.write_text(target.read_text() + text)
    subprocess.run([*git, "commit", "-qam", "pr"], check=True)
    return repo


def _evaluate(repo: Path, tmp_path: Path) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalbot",
            "evaluate",
            "--repo",
            str(repo),
            "--base",
            "main",
            "--head",
            "pr",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--seed",
            "7",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, json.loads((out / "result.json").read_text()), (out / "report.md").read_text()


def test_a_pr_that_edits_the_rules_is_skipped_without_running_anything(tmp_path):
    repo = _repo_with_branch(tmp_path, "rules/gates.yaml", "\n# loosen the bar\n")
    code, result, report = _evaluate(repo, tmp_path)
    assert code == 4 and result["verdict"]["status"] == "SKIPPED"
    assert "rules/gates.yaml" in result["verdict"]["reasons"][0]
    assert "SKIPPED" in report and not (tmp_path / "work" / "venvs").exists()  # nothing was built


def test_a_pr_that_edits_the_bench_driver_is_skipped(tmp_path):
    repo = _repo_with_branch(tmp_path, "engine/cli.py", "\n# report 2x the decode rate\n")
    code, result, _ = _evaluate(repo, tmp_path)
    assert code == 4 and "engine/cli.py" in result["verdict"]["reasons"][0]


def test_an_unknown_revision_is_infra(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalbot",
            "evaluate",
            "--repo",
            str(ROOT),
            "--base",
            "HEAD",
            "--head",
            "no-such-branch",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert json.loads((out / "result.json").read_text())["verdict"]["status"] == "INFRA_ERROR"


def test_a_broken_build_is_the_prs_fault_with_its_log(tmp_path):
    repo = _repo_with_branch(tmp_path, "engine/model.py", "\ndef broken(:\n")
    code, result, report = _evaluate(repo, tmp_path)
    assert code == 1 and result["verdict"]["status"] == "REJECT"
    failure = result["measurements"]["failures"][0]
    assert failure["side"] == "head" and failure["stage"] == "build"
    assert "SyntaxError" in failure["log_tail"] or "invalid syntax" in failure["log_tail"]
    assert "build" in report


def test_main_broken_too_is_infra_not_the_pr(tmp_path):
    repo = _repo_with_branch(tmp_path, "engine/model.py", "\ndef broken(:\n", break_main="engine/model.py")
    code, result, _report = _evaluate(repo, tmp_path)
    assert code == 3 and result["verdict"]["status"] == "INFRA_ERROR"
    assert (
        "infra-error" in result["verdict"]["labels_add"]
        and "regression" not in result["verdict"]["labels_add"]
    )


def test_red_team_head_sees_no_secrets_no_network_and_its_fake_json_goes_nowhere(tmp_path):
    """A head that hunts for tokens, phones home, and prints a fabricated record: the sandbox hides the
    first two (else it would exit with 'sandbox leak'), and the serving harness keeps stdout for protocol
    lines, so the third lands on stderr and decides nothing."""
    import os
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    payload = (
        "\nimport os as _os, socket as _socket\n"
        "_leak = [k for k in _os.environ if 'TOKEN' in k or k.startswith('EVALBOT_')]\n"
        "try:\n"
        f"    _socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
        "    _net = True\n"
        "except OSError:\n"
        "    _net = False\n"
        "if _leak or _net:\n"
        "    raise SystemExit(f'sandbox leak: env {_leak} network {_net}')\n"
        'print(\'{"schema": "evalbot.engine.bench/1", "decode_tps": 1e9}\')\n'
    )
    repo = _repo_with_branch(tmp_path, "engine/model.py", payload)
    out = tmp_path / "out"
    env = {**os.environ, "GITHUB_TOKEN": "ghp_secret", "EVALBOT_STATE_DB": "/secret/state.db"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalbot",
            "evaluate",
            "--repo",
            str(repo),
            "--base",
            "main",
            "--head",
            "pr",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--seed",
            "7",
            "--no-accuracy",
            "--no-spec",
            "--max-pairs",
            "2",
            "--rules",
            str(_random_weight_rules(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    listener.close()
    result = json.loads((out / "result.json").read_text())
    assert result["measurements"]["failures"] == [], proc.stderr[-2000:]  # it ran: no leak, no network
    # no tier; a regression call is allowed (the tiny shape's prefill takes a millisecond, and 2 pairs of it
    # are what they are): the head is judged on its measured speed, never on the record it printed. 2 pairs
    # are 2 blocks, 1 degree of freedom, which decides no tier (CI once read this equal code +11.1%, 95% CI
    # +7.8% to +14.4%, an M, before verdict.decide.MIN_DF)
    failed = {g["name"] for g in result["verdict"]["gates"] if not g["passed"]}
    assert result["verdict"]["tier"] is None and failed <= {"no regression"}, result["verdict"]["reasons"]
    # the 1e9 tok/s went nowhere: it would read as a ratio of 10^5 and more (the tiny shape's timings are
    # noisy, and this runs beside other tests, so the honest ratio is only bounded loosely)
    assert all(e["ratio"] < 20 for e in result["verdict"]["estimates"])
    assert "ghp_secret" not in (out / "report.md").read_text()


def _evaluate_flags(repo: Path, tmp_path: Path, *flags: str) -> tuple[int, dict]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalbot",
            "evaluate",
            "--repo",
            str(repo),
            "--base",
            "main",
            "--head",
            "pr",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--seed",
            "11",
            "--max-pairs",
            "2",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert (out / "result.json").exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads((out / "result.json").read_text())


def test_a_speculative_speedup_that_skips_verification_is_rejected(tmp_path):
    cheat = (
        "\n\ndef verify_greedy(logits, drafts):  # 'faster': trust the drafter\n"
        "    return len(drafts), int(logits[len(drafts)].argmax())\n"
    )
    repo = _repo_with_branch(tmp_path, "engine/speculative.py", cheat)
    code, result = _evaluate_flags(
        repo, tmp_path, "--no-accuracy", "--rules", str(_one_context_rules(tmp_path))
    )
    assert code == 1 and result["verdict"]["status"] == "REJECT"
    failed = {g["name"] for g in result["verdict"]["gates"] if not g["passed"]}
    assert "spec lossless" in failed and "spec-fail" in result["verdict"]["labels_add"]
    spec = result["measurements"]["spec"][0]
    assert spec["lossless_runs"] == 0 and spec["first_divergence"] is not None
    assert (
        spec["head_tau"] > spec["base_tau"]
    )  # the cheat "accepts" more: exactly what the gate must not reward


def test_an_accuracy_break_is_rejected_on_top1_and_kl(tmp_path):
    broken = (
        "\n\ndef rms_norm(x, weight, eps):  # 'simplified': forgets the learned scale\n"
        "    xf = x.float()\n"
        "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)\n"
    )
    repo = _repo_with_branch(tmp_path, "engine/model.py", broken)
    code, result = _evaluate_flags(repo, tmp_path, "--no-spec", "--rules", str(_one_context_rules(tmp_path)))
    assert code == 1 and result["verdict"]["status"] == "REJECT"
    failed = {g["name"] for g in result["verdict"]["gates"] if not g["passed"]}
    assert {"accuracy top-1", "accuracy KL"} <= failed and "accuracy-fail" in result["verdict"]["labels_add"]
    acc = result["measurements"]["accuracy"][0]
    assert acc["top1_agreement"] < 0.9 <= acc["base_top1_agreement"]


def _one_context_rules(tmp_path: Path) -> Path:
    """The shipped rules and the real model, with a cpu profile of one context and short requests: the
    gates these tests check (speculative losslessness, accuracy against llama.cpp) run on the real engine
    and the real reference, and a second context would only repeat them."""
    import shutil

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "profiles.yaml").write_text(
        """\
cpu:
  device: cpu
  contexts:
    - {ctx: 128, guarded: true, scored: true}
  measurement:
    decode_tokens: 16
    warmup_runs: 1
    ci_half_width: 0.005
    min_pairs: 2
    max_pairs: 2
    pairs_per_block: 2
    min_blocks: 2
    time_budget_s: 600
"""
        + LOOSE_QUIET
        + _shipped_profile("gpu")
    )
    _only_cpu_and_gpu(rules)
    return rules


def _random_weight_rules(tmp_path: Path) -> Path:
    """The shipped rules with a cpu profile that measures a random-weight shape (as the gpu profile does,
    where no model file can travel): there is no llama.cpp for random weights, so main is the reference.
    The shape is qwen3-tiny: what these tests check (the sandbox, the audit, the spec gate) does not depend
    on the model's size, and a run takes seconds instead of minutes. (Not the speculative cheat: a random
    model's greedy text cycles, so the n-gram drafter's guesses are right and accepting them all is
    lossless there.)"""
    import shutil

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    (rules / "profiles.yaml").write_text(
        """\
cpu:
  device: cpu
  contexts:
    - {ctx: 64, guarded: true, scored: true}
  measurement:
    decode_tokens: 32  # the layer-skip fails on 4 requests of 32 tokens whatever its continuation token draws
    warmup_runs: 1
    ci_half_width: 0.005
    min_pairs: 2
    max_pairs: 4
    pairs_per_block: 2
    min_blocks: 2
    time_budget_s: 600
"""
        + LOOSE_QUIET
        + _shipped_profile("gpu")
    )  # the spec pair below runs on the gpu profile: not this run's
    _only_cpu_and_gpu(rules)
    models = (rules / "models.yaml").read_text()
    models = models.replace(
        "    - registry: qwen2.5-coder-0.5b\n      sha256: "
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32\n  gpu:",
        "    - shape: qwen3-tiny\n  gpu:",
    )
    (rules / "models.yaml").write_text(models.replace("spec:\n  profile: cpu", "spec:\n  profile: gpu"))
    return rules


def _only_cpu_and_gpu(rules: Path) -> None:
    """The shipped rules less the two-model profile (models.yaml names each profile of profiles.yaml exactly)
    and tracks.yaml (which scores it): these tests rewrite profiles.yaml with cpu and gpu only."""
    (rules / "tracks.yaml").unlink()
    models = (rules / "models.yaml").read_text()
    start = models.index("  cpu-both:\n")
    end = models.index("\n\n", start)
    (rules / "models.yaml").write_text(models[:start] + models[end + 1 :])


def _shipped_profile(name: str) -> str:
    """One profile's section of the shipped profiles.yaml, verbatim."""
    text = (ROOT / "rules" / "profiles.yaml").read_text()
    start = text.index(f"\n{name}:\n") + 1
    end = text.find("\n\n", start)
    return text[start:] if end < 0 else text[start : end + 1]


LAYER_SKIP = (
    "\n\n_forward = Transformer.forward\n\n\n"
    "def _skipping(self, ids, start, cache, last_only=False):  # 'early exit' for decode steps\n"
    "    if ids.shape[1] > 1:\n"
    "        return _forward(self, ids, start, cache, last_only)\n"
    "    blocks = self.blocks\n"
    "    self.blocks = blocks[:-1]\n"
    "    try:\n"
    "        return _forward(self, ids, start, cache, last_only)\n"
    "    finally:\n"
    "        self.blocks = blocks\n\n\n"
    "Transformer.forward = _skipping\n"
)


@pytest.mark.parametrize(
    ("edit", "shortcut"), [("\n# a comment: main against itself\n", False), (LAYER_SKIP, True)]
)
def test_random_weights_are_audited_by_main_and_a_layer_skip_fails(tmp_path, edit, shortcut):
    """Where the weights are random (the gpu profile) main's own engine is the reference: it scores the
    PR's timed tokens teacher-forced. A decode path that skips a layer fails; main against itself passes."""
    repo = _repo_with_branch(tmp_path, "engine/model.py", edit)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalbot",
            "evaluate",
            "--repo",
            str(repo),
            "--base",
            "main",
            "--head",
            "pr",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--seed",
            "3",
            "--rules",
            str(_random_weight_rules(tmp_path)),
            "--no-accuracy",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    result = json.loads((out / "result.json").read_text())
    audits = {
        a["side"]: {**a, "share": a["agreeing"] / a["tokens"]} for a in result["measurements"]["audits"]
    }
    # the PR's checkout (the head merged into main) is gone; main's stays for the next evaluation
    prov = result["measurements"]["provenance"]
    left = {p.name for p in (tmp_path / "work" / "worktrees").iterdir() if p.is_dir()}
    assert prov["measured_sha"] != prov["base_sha"] and left == {prov["base_sha"]}, left
    assert audits and all(a["reference"] == "main" for a in audits.values()), proc.stderr[-2000:]
    assert audits["base"]["violations"] == 0 and audits["base"]["share"] >= 0.95
    failed = {g["name"] for g in result["verdict"]["gates"] if not g["passed"]}
    if shortcut:
        assert result["verdict"]["status"] == "REJECT" and "decode agreement" in failed, (
            result["verdict"]["reasons"],
            failed,
            audits,
        )
        assert audits["head"]["share"] < 0.95 or audits["head"]["violations"] > 0
    else:
        assert "decode agreement" not in failed and audits["head"]["violations"] == 0
