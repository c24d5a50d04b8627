"""`evalbot evaluate` end to end on the fixture engine (tests/fixtures/fixture_engine).

The fixture is a tiny numpy transformer with the real protocol, so the real CLI runs unchanged:
git archive, builds into venvs (sandboxed), engine processes under bubblewrap interleaved ABBA,
schema checks, the float64 reference, n-gram speculative decoding, verdict, report and receipt.
Each branch (tests/fixtures/fixture_engine_branches.py) is one kind of PR, honest or hostile.

One repository, model cache and work dir serve the whole module, so main is built once and each
head once (venvs are cached by tree hash).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import select
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from evalbot.model import UTILIZATION_METRIC
from evalbot.policy.sensitive_paths import harness_hits
from evalbot.rules import Rules, default_rules_dir, load_rules
from tests.evalbot.test_rules import tier_for_ci_low
from tests.fixtures import fixture_engine_branches as fb

PY = sys.executable
SECRET = "ghp_fixtureSecret0123456789abcdef"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        subprocess.run(
            [
                PY,
                "-c",
                "from evalbot.evaluate.sandbox import sandbox_available as a; raise SystemExit(not a())",
            ],
            capture_output=True,
        ).returncode
        != 0,
        reason="bubblewrap cannot create namespaces here",
    ),
]


@dataclass(frozen=True)
class Lab:
    root: Path
    repo: Path
    cache: Path  # XDG_CACHE_HOME of evaluate: the fixture's model cache lives under it
    work: Path
    model: Path
    sha256: str
    rules_dir: Path
    rules: Rules


@dataclass(frozen=True)
class Run:
    code: int
    result: dict
    report: str
    stderr: str
    elapsed_s: float
    out: Path
    peak_rss_kib: int | None = None  # the evaluate process tree's largest resident set, when measured

    @property
    def verdict(self) -> dict:
        return self.result["verdict"]

    @property
    def measurements(self) -> dict:
        return self.result["measurements"]

    @property
    def why(self) -> str:
        """What decided the outcome, for a failing assertion: the reasons, failures and stderr's tail."""
        return (
            f"exit {self.code}, {self.verdict['status']}: {self.verdict['reasons']}; failures "
            f"{self.measurements.get('failures')}; stderr ...{self.stderr[-1500:]}"
        )

    def failed_gates(self) -> list[dict]:
        return [g for g in self.verdict["gates"] if not g["passed"]]

    def decode_estimates(self) -> dict[int, dict]:
        return {e["context"]: e for e in self.verdict["estimates"] if e["metric"] == "decode_tps"}


def write_rules(
    dest: Path,
    sha256: str,
    *,
    run_timeout_s: int = 60,
    max_output_mb: int = 64,
    max_wait_s: float = 120,
    max_other_cores: float = 0.4,
    max_pairs: int = 24,
    no_regression: float = 0.7,
) -> Path:
    """The shipped rules, with a cpu profile sized for the fixture, tiers and a no-regression tolerance
    scaled to its noise, and models.yaml naming its model."""
    dest.mkdir(parents=True)
    shipped = default_rules_dir()
    for path in shipped.glob("*.yaml"):
        if path.name not in (
            "profiles.yaml",
            "models.yaml",
            "tiers.yaml",
            "tracks.yaml",
        ):  # its own profile, as profiles.yaml scores it
            (dest / path.name).write_text(path.read_text())
    # the fixture's byte-level model is no architecture llama.cpp runs: its main brings its own reference
    # (engine/reference.py, a float64 evaluation of the model's definition), compare and registry
    engine = (dest / "engine.yaml").read_text()
    assert engine.count("\nreference: evalbot\n") == 1, "the shipped engine.yaml changed: update write_rules"
    engine = engine.replace("\nreference: evalbot\n", "\nreference: main\n")
    project = (
        "\n  project: engine-dist\n"  # this repository's engine ships from there; the fixture's from its root
    )
    assert engine.count(project) == 1, "the shipped engine.yaml changed: update write_rules"
    (dest / "engine.yaml").write_text(engine.replace(project, "\n"))
    # The no-regression tolerance scaled to the same noise: the shipped 0.98 is 2% against the fixture's CI
    # half-widths of 4-10% (4 blocks, 2 degrees of freedom; its prefill, a millisecond of numpy, moves
    # more), so equal code was called a regression at about the interval's 2.5% a context and metric. CI
    # saw it (2026-12-05: equal code at ctx 128 read 0.879x beside a real 0.126x at 512), and so did this
    # box (a decode-only speedup's unchanged prefill at ctx 128 read 0.785x [0.741, 0.832], a REJECT). On
    # the real engine the half-widths are 0.3-0.7% and 2% keeps such a call several sigma away. The
    # regressions the fixture's tests must catch are far past 0.7 (regress-long 0.11-0.13x at 512; the
    # burst's prefill carries the whole decode).
    gates = (dest / "gates.yaml").read_text()
    line = "\n  min_ratio: 0.98\n"
    assert gates.count(line) == 1, "the shipped gates.yaml changed: update write_rules"
    (dest / "gates.yaml").write_text(gates.replace(line, f"\n  min_ratio: {no_regression}\n"))
    # The fixture decodes a token in milliseconds of numpy, and this box's timings of such short work
    # vary by 10-15% request to request (the engine's own clock sees the same): tiers scaled to that
    # noise keep the verdicts decided (the shipped +2% floor would make every fixture run INCONCLUSIVE;
    # with 12 pairs in 4 blocks its MDE is 15-45%; the crossover's interval has J - 2 degrees of
    # freedom, so up to 6 blocks of 4 pairs: on a slow 2-core AMD box 4 blocks read MDEs of 41-74%).
    (dest / "tiers.yaml").write_text("lower_bounds:\n  XS: 0.5\n  S: 0.6\n  M: 0.7\n  L: 0.8\n  XL: 1.0\n")
    (dest / "profiles.yaml").write_text(f"""\
cpu:
  device: cpu
  contexts:
    - {{ctx: 128, guarded: true, scored: true}}
    - {{ctx: 512, guarded: true, scored: true}}
  measurement:
    decode_tokens: 32
    warmup_runs: 1
    ci_half_width: 0.005
    min_pairs: 5
    max_pairs: {max_pairs}
    pairs_per_block: 4
    min_blocks: 4
    time_budget_s: 600
    run_timeout_s: {run_timeout_s}
    max_output_mb: {max_output_mb}
  quiet:
    max_other_cores: {max_other_cores}
    max_gpu_util: 5
    sample_s: 0.25
    max_wait_s: {max_wait_s}
""")
    block = load_rules(shipped).spec_pair.block
    ref = f"{{registry: {fb.MODEL_NAME}, sha256: {sha256}}}"
    (dest / "models.yaml").write_text(
        f"profiles:\n  cpu:\n    - {ref}\nspec:\n  profile: cpu\n  target: {ref}\n  draft: {ref}\n  block: {block}\n"
    )
    return dest


@pytest.fixture
def lab(_lab: Lab, request: pytest.FixtureRequest) -> Lab:
    """The module's lab. A test marked `timing` (its assertions read the A/B's numbers) gets the quiet-box
    guard of the shipped rules and runs alone, after the rest (make test); every other test checks what
    the A/B's noise cannot move (a sandbox, a correctness gate, a build, a skip) and gets rules whose
    guard lets it run beside the rest of the suite."""
    if request.node.get_closest_marker("timing"):
        return _lab
    return dataclasses.replace(_lab, rules_dir=_lab.root / "rules-loose")


@pytest.fixture(scope="module")
def _lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    root = tmp_path_factory.mktemp("fixture-e2e")
    cache = root / "cache"
    # the fixture's own fetcher, as evaluate's trusted fetch step runs it
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [PY, "-m", "engine.registry", "fetch", fb.MODEL_NAME],
        cwd=fb.TEMPLATE,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    model = Path(proc.stdout.strip().splitlines()[-1])
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    rules_dir = write_rules(root / "rules", sha)
    write_rules(root / "rules-loose", sha, max_other_cores=64)  # other work on the box never waits
    rules = load_rules(rules_dir)
    # engine/cli.py, protocol.py, prompts.py by the shipped policy; reference, compare and registry because
    # the fixture's main brings the reference tools (reference: main)
    assert harness_hits(fb.HARNESS_FILES, rules) == tuple(fb.HARNESS_FILES)
    repo = fb.make_repo(root / "repo", fb.STANDARD)
    return Lab(root, repo, cache, root / "work", model, sha, rules_dir, rules)


def evaluate(
    lab: Lab,
    head: str,
    *flags: str,
    base: str = "main",
    seed: int = 20240611,
    rules_dir: Path | None = None,
    work: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 300,
    cwd: Path | None = None,
    measure_rss: bool = False,
    requeue_busy: bool = True,
) -> Run:
    """Run the real `evalbot evaluate` CLI in a subprocess and read what it wrote.

    It runs from lab.root unless told otherwise: the bot's own checkout (this repository's root) holds
    an `engine` package too, which shadows main's harness (see the xfail test below).

    An evaluation that ends in INFRA_ERROR "box busy" (another job used this shared box: CI's
    runners are) is run once more, as the bot queues it again; requeue_busy=False returns it as it is.
    """
    run = _evaluate_once(lab, head, flags, base, seed, rules_dir, work, env, timeout_s, cwd, measure_rss)
    if requeue_busy and _box_busy(run):
        print(f"{head}: box busy, measured again as the bot would: {run.measurements['failures']}")
        run = _evaluate_once(lab, head, flags, base, seed, rules_dir, work, env, timeout_s, cwd, measure_rss)
    return run


def _box_busy(run: Run) -> bool:
    failures = run.measurements.get("failures") or []
    return (
        run.verdict["status"] == "INFRA_ERROR"
        and bool(failures)
        and all(f["stage"] == "box" for f in failures)
    )


def _evaluate_once(lab: Lab, head: str, flags: tuple[str, ...], base: str, seed: int, rules_dir: Path | None,
                   work: Path | None, env: dict[str, str] | None, timeout_s: float, cwd: Path | None,
                   measure_rss: bool) -> Run:  # fmt: skip
    out = lab.root / f"out-{head}-{uuid.uuid4().hex[:6]}"
    argv = [
        PY,
        "-m",
        "evalbot",
        "evaluate",
        "--repo",
        str(lab.repo),
        "--base",
        base,
        "--head",
        head,
        "--rules",
        str(rules_dir or lab.rules_dir),
        "--profile",
        "cpu",
        "--out",
        str(out),
        "--work-dir",
        str(work or lab.work),
        "--seed",
        str(seed),
        *flags,
    ]
    full_env = {**os.environ, "XDG_CACHE_HOME": str(lab.cache), **(env or {})}
    full_env.pop("EVALBOT_SIGNING_KEY", None)
    rss_file = out.with_suffix(".rss")
    if measure_rss:  # a fresh parent whose only children are this evaluate and what it starts
        launcher = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
                    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
                    "sys.exit(rc)")  # fmt: skip
        argv = [PY, "-c", launcher, str(rss_file), *argv]
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env=full_env, cwd=cwd or lab.root
    )
    elapsed = time.monotonic() - t0
    assert (out / "result.json").is_file(), proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert (out / "receipt.json").is_file() and (out / "report.md").is_file()
    rss = int(rss_file.read_text()) if measure_rss else None
    return Run(proc.returncode, result, (out / "report.md").read_text(), proc.stderr, elapsed, out, rss)


def _head_failure(run: Run, stage: str) -> dict:
    failures = run.measurements["failures"]
    assert [(f["side"], f["stage"]) for f in failures] == [("head", stage)], failures
    return failures[0]


def _assert_measured_honestly(run: Run) -> None:
    """The head ran like main: no failure, no gain; a regression call is allowed, as noise on equal code.

    (With the few pairs these tests use, a busy shared box can make equal code look a few percent
    slower with a deceptively narrow CI; that is what the regression gate is for, not what is tested.)
    """
    assert run.measurements["failures"] == [], run.measurements["failures"]
    failed = {g["name"] for g in run.failed_gates()}
    assert failed <= {"no regression"}, run.verdict["reasons"]
    if run.verdict["status"] == "INCONCLUSIVE":  # too few pairs to resolve the smallest tier: no verdict
        assert run.code == 5
    else:
        assert run.code == (1 if failed else 0)
    _assert_no_fabricated_gain(run)


def _assert_ran(run: Run) -> None:
    """The head ran to the end like main (no failure, no tier, no gate failed but a noisy regression
    call): what a test checks that does not time anything, run beside the rest of the suite."""
    assert run.measurements["failures"] == [], run.measurements["failures"]
    assert {g["name"] for g in run.failed_gates()} <= {"no regression"}, run.verdict["reasons"]
    assert run.verdict["tier"] is None


def _assert_no_fabricated_gain(run: Run) -> None:
    """The red-team heads report 3x (or more) when their attack works; honest numbers stay near 1x.

    (The bound is 2x, not nearer 1x: with the 2 pairs most of these runs take, one pair slowed by a shared
    CI box moves the geometric mean a long way. CI saw an honest head at 1.60x with 2 pairs at ctx 512.)
    """
    for ctx, e in run.decode_estimates().items():
        assert e["ratio"] < 2.0, f"ctx {ctx}: the head measured {e['ratio']:.2f}x main: {e}"
    assert run.verdict["tier"] is None


# ---------------------------------------------------------------- honest PRs


@pytest.mark.timing
def test_a_genuine_speedup_passes_with_the_tier_its_lower_bound_earns(lab: Lab):
    run = evaluate(lab, "speedup")
    assert run.code == 0 and run.verdict["status"] == "PASS", run.why
    scored = [e for e in run.verdict["estimates"] if e["metric"] == "decode_tps" and e["scored"]]
    assert {e["context"] for e in scored} == {128, 512} and all(e["n"] >= 5 for e in scored)
    names = [t.name for t in lab.rules.tiers]
    expected = max(
        scored,
        key=lambda e: (
            names.index(t) + 1 if (t := tier_for_ci_low(lab.rules, e["ci_low"])) else 0,
            e["ci_low"],
        ),
    )
    tier = tier_for_ci_low(lab.rules, expected["ci_low"])
    assert tier is not None and run.verdict["tier"] == tier
    assert run.verdict["scored_context"] == expected["context"]
    labels = run.verdict["labels_add"]
    assert "verified" in labels and next(t.label for t in lab.rules.tiers if t.name == tier) in labels
    # the other gates ran and passed: accuracy against the float64 reference, lossless speculation
    gates = {g["name"]: g for g in run.verdict["gates"]}
    assert gates["accuracy top-1"]["passed"] and gates["accuracy top-1"]["value"] == 1.0
    assert gates["accuracy KL"]["value"] < 1e-6
    # the same outputs, so the same verify steps: tau's ratio is 1 and its upper bound at least that
    assert gates["spec lossless"]["passed"] and gates["spec tau"]["passed"]
    assert gates["spec tau"]["value"] >= 1.0 - 1e-9
    # the spec runs spread over blocks 1-3 (min_blocks 4), one a block: three pairs of processes, not one
    spec = run.measurements["spec"]
    assert spec and all(sorted(s["spec_blocks"]) == [1, 2, 3] for s in spec), [s["spec_blocks"] for s in spec]
    assert run.measurements["provenance"]["model_sha256s"] == {fb.MODEL_NAME: lab.sha256}
    assert f"perf:{tier}" in run.report or tier in run.report


@pytest.mark.timing
def test_a_regression_at_one_context_is_rejected_naming_that_context(lab: Lab):
    # (the fixture's no-regression tolerance is 0.7, scaled to its noise: see write_rules)
    run = evaluate(lab, "regress-long", "--no-accuracy", "--no-spec")
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    failed = run.failed_gates()
    assert failed and {(g["name"], g["context"]) for g in failed} == {("no regression", 512)}, failed
    reasons = " ".join(run.verdict["reasons"])
    assert "ctx 512" in reasons and "ctx 128" not in reasons
    est = run.decode_estimates()
    assert est[512]["ci_high"] < 0.7 and est[512]["regression"] and not est[128]["regression"]
    assert "regression" in run.verdict["labels_add"] and run.verdict["tier"] is None


def test_an_accuracy_break_is_rejected_on_top1_and_kl(lab: Lab):
    run = evaluate(lab, "accuracy-break", "--no-spec", "--max-pairs", "2")
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    failed = {g["name"] for g in run.failed_gates()}
    assert {"accuracy top-1", "accuracy KL"} <= failed, failed
    acc = run.measurements["accuracy"][0]
    assert acc["top1_agreement"] < 0.9 <= acc["base_top1_agreement"] and acc["kl_mean"] > 0.1
    assert "accuracy-fail" in run.verdict["labels_add"]


def test_a_speculative_speedup_that_skips_verification_is_rejected_on_losslessness(lab: Lab):
    run = evaluate(lab, "spec-cheat", "--no-accuracy", "--max-pairs", "2")
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    assert "spec lossless" in {g["name"] for g in run.failed_gates()}
    spec = run.measurements["spec"][0]
    assert spec["lossless_runs"] == 0 and spec["first_divergence"] is not None
    assert spec["head_tau"] > spec["base_tau"]  # it "accepts" more: exactly what must not be rewarded
    assert "spec-fail" in run.verdict["labels_add"]


@pytest.mark.timing  # asserts on spec rates of runs a few ms long: alone, as every timed test runs
def test_a_spec_answer_replayed_from_a_plain_decode_of_the_same_prompt_gains_nothing(lab: Lab):
    """An engine that remembers every plain answer and, asked to decode the same prompt speculatively, sends
    it again in verify-sized lines (lossless, no burst): each spec run takes a prompt that an earlier block's
    processes decoded, so the processes running it have nothing to replay and the PR's spec rate and tau are
    its honest ones. (The fixture answers in one part; `test_spec_spread.py` checks the two-part path.)"""
    run = evaluate(lab, "spec-replay", "--no-accuracy")
    assert run.verdict["status"] in ("PASS", "INCONCLUSIVE"), run.why  # plain decode is main's
    assert run.measurements["spec"]
    for s in run.measurements["spec"]:
        assert s["lossless_runs"] == s["runs"] >= 3
        assert s["head_tau"] == pytest.approx(s["base_tau"])  # a replay's lines would carry 6 tokens a step
        ratio = math.exp(sum(math.log(h / b) for b, h in s["spec_pairs"]) / len(s["spec_pairs"]))
        assert ratio < 1.5, (s["context"], ratio, s["spec_pairs"])
        assert 0 not in s["spec_blocks"] and len(set(s["spec_blocks"])) == 3


@pytest.mark.parametrize(
    ("branch", "evidence"),
    [
        ("build-syntax", "SyntaxError"),
        ("build-import", "No module named 'engine.fast_kernels'"),
    ],
)
def test_a_broken_build_is_rejected_with_its_log(lab: Lab, branch: str, evidence: str):
    run = evaluate(lab, branch, "--no-spec", "--no-accuracy")
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    failure = _head_failure(run, "build")
    assert evidence in failure["log_tail"], failure["log_tail"][-1500:]
    assert run.measurements["throughput"] == []  # nothing ran


def test_a_harness_crash_on_main_and_the_pr_is_infra_not_the_prs_fault(lab: Lab):
    run = evaluate(
        lab, "on-broken-main", "--no-spec", "--no-accuracy", "--max-pairs", "2", base="main-broken"
    )
    assert run.code == 3 and run.verdict["status"] == "INFRA_ERROR", run.verdict
    failures = run.measurements["failures"]
    assert failures and failures[0]["side"] == "base" and failures[0]["stage"] == "serve"
    assert "cannot feed 1 tokens" in failures[0]["message"]
    labels = run.verdict["labels_add"]
    assert "infra-error" in labels and "regression" not in labels and run.verdict["tier"] is None


# ---------------------------------------------------------------- the harness first, and a quiet box


@pytest.mark.timing
def test_a_reference_that_dies_by_a_signal_is_infra_within_a_minute_naming_the_signal(lab: Lab):
    """main's reference is computed before the PR is built or any pair runs; when it dies, the report
    says how (the signal by name, the exit code, its stderr), within a minute of the start."""
    fb.add_branch(lab.repo, fb.MAIN_REFERENCE_SIGILL)
    fb.add_branch(lab.repo, fb.PR_ON_SIGILL_MAIN)
    run = evaluate(lab, "pr-on-sigill-main", "--no-spec", base="main-reference-sigill")
    assert run.code == 3 and run.verdict["status"] == "INFRA_ERROR", run.verdict
    assert run.elapsed_s < 60, f"took {run.elapsed_s:.0f} s"
    [failure] = run.measurements["failures"]
    assert failure["side"] == "harness" and failure["stage"] == "reference"
    assert "SIGILL, illegal instruction" in failure["message"] and "exit code -4" in failure["message"]
    assert "tilezero" in failure["log_tail"]
    assert "SIGILL, illegal instruction" in run.report and "tilezero" in run.report
    assert (
        run.measurements["throughput"] == [] and "head" not in run.measurements["provenance"]["engine_build"]
    )


def test_a_pr_that_repoints_packaging_at_another_harness_is_never_run(lab: Lab):
    """No harness file changes, but pyproject.toml builds engine/ from a copy whose cli.py is rigged:
    the built venv's engine.cli differs from main's byte for byte, so the bot never runs it."""
    fb.add_branch(lab.repo, fb.package_dir_branch())
    run = evaluate(lab, "package-dir", "--no-spec", "--no-accuracy")
    assert run.code == 4 and run.verdict["status"] == "SKIPPED", run.verdict
    reason = run.verdict["reasons"][0]
    assert "does not import main's harness" in reason and "engine.cli" in reason
    assert run.measurements["throughput"] == []


HOG = "import sys, time; open('/proc/self/comm', 'w').write('evalbot-hog')\nwhile True: pass"


@pytest.mark.timing
def test_a_busy_box_gives_box_busy_and_a_quiet_one_a_verdict(lab: Lab):
    """A real CPU hog beside evaluate: INFRA_ERROR "box busy", naming it by its command name and never
    by its arguments. With the hog stopped, the same evaluation completes."""
    rules_dir = write_rules(lab.root / "rules-quiet", lab.sha256, max_wait_s=4)
    hog = subprocess.Popen([PY, "-c", HOG, "--api-key=hog-SECRET-arg"])
    try:
        busy = evaluate(lab, "speedup", "--no-spec", "--no-accuracy", rules_dir=rules_dir, requeue_busy=False)
    finally:
        hog.kill()
        hog.wait()
    assert busy.code == 3 and busy.verdict["status"] == "INFRA_ERROR", busy.verdict
    [failure] = busy.measurements["failures"]
    assert failure["stage"] == "box" and failure["message"].startswith("box busy: ")
    assert (
        "evalbot-hog" in failure["message"] and "SECRET" not in busy.report and "api-key" not in busy.report
    )
    assert busy.measurements["throughput"] == []  # no pair was measured on the busy box
    quiet = evaluate(lab, "speedup", "--no-spec", "--no-accuracy", rules_dir=rules_dir)
    assert quiet.measurements["failures"] == [] and quiet.verdict["status"] in ("PASS", "INCONCLUSIVE")
    samples = quiet.measurements["box_samples"]
    blocks = [s for s in samples if "other_cores" in s]  # before each block of serving processes
    pairs = [s for s in samples if "during_other_cores" in s]  # while each pair ran
    assert blocks and pairs and all(s["other_cores"] <= 0.4 for s in blocks)
    assert all(s["during_other_cores"] <= 0.4 for s in pairs)
    assert "others' CPU before pairs" in quiet.report


# ---------------------------------------------------------------- red team
#
# Each attack is first run here, unconfined, as a control (it must work when nothing stops it), then
# as a PR through evaluate.


def _hook_code(branch: fb.Branch) -> dict:
    """Execute the code a hooked branch appends to engine/model.py; its namespace."""
    body = next(e.new for e in branch.edits if e.path == "engine/model.py" and e.old is None)
    namespace: dict = {}
    exec(compile(body, f"<{branch.name}>", "exec"), namespace)
    return namespace


def test_secrets_in_the_bots_environment_never_reach_the_head(lab: Lab, monkeypatch, capsys):
    monkeypatch.setattr(time, "perf_counter", time.perf_counter)  # the control patches it; restore after
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    _hook_code(fb.ENV_LEAK)["_probe"]()
    assert f"GITHUB_TOKEN={SECRET}" in capsys.readouterr().err
    monkeypatch.undo()
    env = {
        "GITHUB_TOKEN": SECRET,
        "EVALBOT_STATE_DB": "/srv/evalbot/state.db",
        "EVALBOT_WEBHOOK_SECRET": SECRET + "-hook",
        "AWS_SECRET_ACCESS_KEY": SECRET + "-aws",
    }
    run = evaluate(lab, "env-leak", "--no-spec", "--no-accuracy", "--max-pairs", "2", env=env)
    _assert_ran(run)
    for path in run.out.iterdir():
        assert SECRET not in path.read_text(), path.name
    assert "leak:" not in run.stderr


def test_the_runners_signing_key_and_token_are_unreadable_by_the_head(lab: Lab, tmp_path: Path):
    """The runner signs with a key file (the workflow's EVALBOT_RUNNER_KEY_FILE, passed as --key) and has
    a GitHub token in its environment. A head that looks for them where they are, in every process's
    command line and environment, and at the key's path itself, gets none of them: it would stop its
    engine naming what it read (the control shows it does, run on the host)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = tmp_path / "runner" / "signing.pem"
    key.parent.mkdir()
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key.chmod(0o600)
    branch = fb.key_thief_branch([str(key)])
    with pytest.raises(SystemExit, match=r"stole: .*signing\.pem: -----BEGIN PRIVATE KEY"):
        _hook_code(branch)["_probe"]()  # the control: on the host, the thief gets the key
    fb.add_branch(lab.repo, branch)
    env = {"GITHUB_TOKEN": SECRET, "EVALBOT_RUNNER_KEY_FILE": str(key)}
    run = evaluate(
        lab, "key-thief", "--no-spec", "--no-accuracy", "--max-pairs", "2", "--key", str(key), env=env
    )
    assert run.measurements["failures"] == [], run.measurements["failures"]  # the thief found nothing
    assert "Receipt: signed by" in run.report  # the harness, outside, did read the key
    assert "stole:" not in run.stderr and "stole:" not in run.report
    for log in (lab.work / "logs").glob("*"):
        assert "stole:" not in log.read_text(errors="replace"), log.name


def _listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    return listener


def test_the_head_cannot_reach_the_network(lab: Lab, monkeypatch):
    with _listener() as control:
        monkeypatch.setattr(time, "perf_counter", time.perf_counter)
        _hook_code(fb.network_branch(control.getsockname()[1]))["_probe"]()
        monkeypatch.undo()
        assert select.select([control], [], [], 0)[0]
    with _listener() as listener:
        fb.add_branch(lab.repo, fb.network_branch(listener.getsockname()[1]))
        run = evaluate(lab, "phone-home", "--no-spec", "--no-accuracy", "--max-pairs", "2")
        pending, _, _ = select.select([listener], [], [], 0)
    assert not pending, "the head connected to a listener on the host"
    _assert_ran(run)


def _host_targets(lab: Lab, store: Path) -> tuple[list[Path], list[str]]:
    dirs = [
        lab.repo,
        lab.repo / "engine",
        lab.work,
        lab.work / "venvs",
        store,
        Path.home(),
        Path("/tmp"),
        lab.cache,
        lab.model.parent,
    ]
    globs = [
        str(lab.work / "venvs" / "*" / "lib" / "python*" / "site-packages" / "engine" / "*.py"),
        str(lab.model.parent / "*"),
        str(lab.repo / "engine" / "*.py"),
        str(store / "*"),
    ]
    return dirs, globs


def _ensure_main_built(lab: Lab) -> None:
    """Build main (a head whose build fails costs nothing more), so that its venv is a target too."""
    evaluate(lab, "build-syntax", "--no-spec", "--no-accuracy")


def _snapshot(globs: list[str]) -> dict[str, str]:
    import glob

    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for g in globs for p in glob.glob(g)}


def _assert_nothing_written(dirs: list[Path], globs: list[str], before: dict[str, str], lab: Lab) -> None:
    leftovers = [d / fb.ESCAPE_MARKER for d in dirs if (d / fb.ESCAPE_MARKER).exists()]
    for p in leftovers:  # never leave litter in the host's home or /tmp, even when failing
        p.unlink()
    assert not leftovers, f"the head wrote on the host: {leftovers}"
    after = _snapshot(globs)
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    assert not changed, f"the head changed host files: {changed}"
    assert hashlib.sha256(lab.model.read_bytes()).hexdigest() == lab.sha256


def test_the_head_cannot_write_outside_its_scratch_dir(lab: Lab, tmp_path: Path):
    control, victim = tmp_path / "control", tmp_path / "victim.py"
    control.mkdir()
    victim.write_text("x = 1\n")
    assert _hook_code(fb.escape_branch([str(control)], [str(victim)]))["_escape"]() == [
        str(control),
        str(victim),
    ]
    assert (control / fb.ESCAPE_MARKER).exists() and "pwned" in victim.read_text()
    store = lab.root / "bot-state"
    store.mkdir(exist_ok=True)
    (store / "evalbot.db").write_bytes(b"SQLite format 3\0")
    _ensure_main_built(lab)
    dirs, globs = _host_targets(lab, store)
    fb.add_branch(lab.repo, fb.escape_branch([str(d) for d in dirs], globs))
    before = _snapshot(globs)
    assert any("site-packages/engine/reference.py" in p for p in before)  # main's trusted harness is a target
    run = evaluate(lab, "escape-run", "--no-spec", "--no-accuracy", "--max-pairs", "2")
    _assert_nothing_written(dirs, globs, before, lab)
    _assert_ran(run)


def test_the_heads_build_is_confined_too(lab: Lab):
    """setup.py and `import engine` (the smoke test) run the PR's code at build time: same walls."""
    store = lab.root / "bot-state-build"
    store.mkdir(exist_ok=True)
    (store / "evalbot.db").write_bytes(b"SQLite format 3\0")
    _ensure_main_built(lab)
    dirs, globs = _host_targets(lab, store)
    before = _snapshot(globs)
    with _listener() as listener:
        sha = fb.add_branch(
            lab.repo, fb.escape_at_build_branch([str(d) for d in dirs], globs, listener.getsockname()[1])
        )
        run = evaluate(lab, "escape-build", "--no-spec", "--no-accuracy", "--max-pairs", "2")
        pending, _, _ = select.select([listener], [], [], 0)
    _assert_nothing_written(dirs, globs, before, lab)
    assert not pending, "the head's build connected to a listener on the host"
    build_log = (lab.work / "logs" / f"build-{sha}.log").read_text()
    assert "attempt from engine._warm: wrote" in build_log and "phoned home: False" in build_log  # it did try
    _assert_ran(run)


@pytest.mark.parametrize(
    ("branch", "path"),
    [
        ("edit-bench-driver", "engine/cli.py"),
        ("edit-prompts", "engine/prompts.py"),
    ],
)
def test_a_pr_that_edits_the_harness_is_skipped_before_anything_runs(
    lab: Lab, tmp_path: Path, branch: str, path: str
):
    work = tmp_path / "work"
    run = evaluate(lab, branch, work=work)
    assert run.code == 4 and run.verdict["status"] == "SKIPPED"
    assert path in run.verdict["reasons"][0]
    assert not (work / "venvs").exists() and run.measurements["throughput"] == []


@pytest.mark.timing
def test_a_fabricated_record_printed_on_stdout_never_reaches_the_protocol(lab: Lab):
    """The head prints a record with an impossible decode rate on stdout at load: the serving harness
    keeps stdout for protocol lines only (anything else goes to stderr), so it changes nothing."""
    run = evaluate(lab, "fake-json", "--no-spec", "--no-accuracy", "--max-pairs", "4")
    _assert_measured_honestly(run)


@pytest.mark.timing
def test_a_fast_path_for_the_default_benchmark_prompt_gains_nothing_on_fresh_prompts(
    lab: Lab, tmp_path: Path
):
    # First show the cheat is real: on the fixture's own default prompt the head's decode is much faster.
    checkout = tmp_path / "prompt-tuned"
    checkout.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(lab.repo), "archive", "prompt-tuned"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(checkout, filter="data")
    other_prompt = tmp_path / "other.txt"
    other_prompt.write_text(Path(fb.TEMPLATE / "README.md").read_text() * 4)

    def decode_tps(*extra: str) -> float:
        proc = subprocess.run(
            [PY, "-m", "engine", "bench", "--model", str(lab.model), "--ctx", "512", "--gen", "16", *extra],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        return json.loads(proc.stdout)["decode_tps"]

    assert decode_tps() > 2 * decode_tps("--prompt-file", str(other_prompt))
    # Then evaluate it: evalbot draws fresh prompts, so the fast path never triggers.
    run = evaluate(lab, "prompt-tuned", "--no-spec", "--no-accuracy", "--max-pairs", "8")
    assert run.verdict["status"] in ("PASS", "REJECT", "INCONCLUSIVE") and run.verdict["tier"] is None, (
        run.verdict
    )
    for ctx, e in run.decode_estimates().items():  # the fast path, when it triggers, is > 2x (above)
        assert e["n"] >= 5 and e["ratio"] < 1.5, (
            f"ctx {ctx}: {e['ratio']:.3f}x (a shared box: 1.30x seen honest)"
        )


@pytest.mark.timing
def test_a_head_that_never_finishes_is_killed_at_the_run_time_limit(lab: Lab):
    marker = f"fixture-sleeper-{uuid.uuid4().hex}"
    fb.add_branch(lab.repo, fb.sleeper_branch(marker))
    rules_dir = write_rules(lab.root / f"rules-timeout-{marker[-6:]}", lab.sha256, run_timeout_s=5)
    run = evaluate(lab, "sleeper", "--no-spec", "--no-accuracy", "--max-pairs", "2", rules_dir=rules_dir)
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    failure = _head_failure(run, "timeout")
    assert "5 s" in failure["message"]
    assert not _survivors(marker), "processes of the head outlived its run"


@pytest.mark.timing
def test_a_head_cannot_leave_a_process_behind_to_slow_main_down(lab: Lab):
    marker = f"fixture-burner-{uuid.uuid4().hex}"
    fb.add_branch(lab.repo, fb.burner_branch(marker))
    run = evaluate(lab, "burner", "--no-spec", "--no-accuracy", "--max-pairs", "2")
    assert not _survivors(marker), "a detached process of the head outlived its run"
    _assert_measured_honestly(run)


def test_a_build_that_replaces_its_interpreter_never_runs_it_on_the_host(lab: Lab, tmp_path: Path):
    """The head's build swaps its venv's bin/python for a launcher that leaves a process behind and then
    behaves as Python. The harness never starts that interpreter on the host (the harness-module probe is
    asked of the trusted toolchain), so nothing of the head survives the evaluation and the launcher
    never touched the host's files; inside the sandbox it ran (it is the engine's interpreter there)."""
    marker = f"fixture-launcher-{uuid.uuid4().hex}"
    ran = tmp_path / "launcher-ran-on-the-host"
    sha = fb.add_branch(lab.repo, fb.launcher_branch(marker, str(ran)))
    run = evaluate(lab, "launcher", "--no-spec", "--no-accuracy", "--max-pairs", "2")
    installed = [p for p in (lab.work / "venvs").glob("*/bin/python") if marker in _text_or_empty(p)]
    assert installed, f"the head's build did not install its launcher: the test proves nothing ({run.why})"
    assert not _survivors(marker), "a process the head's interpreter left behind outlived the evaluation"
    assert not ran.exists(), "the head's launcher ran on the host"
    assert sha and run.measurements["failures"] == [], run.measurements["failures"]


def _text_or_empty(path: Path) -> str:
    try:
        return path.read_text(errors="replace") if not path.is_symlink() else ""
    except OSError:
        return ""


def _survivors(marker: str) -> list[int]:
    """The host's processes whose command line carries marker (killing any, so none outlives the test)."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
                os.kill(int(p.name), 9)
        except OSError:
            pass
    return found


@pytest.mark.timing
def test_a_head_that_floods_stdout_is_stopped_at_the_output_cap(lab: Lab):
    fb.add_branch(lab.repo, fb.flood_branch(256))
    run = evaluate(lab, "flood", "--no-spec", "--no-accuracy", "--max-pairs", "2", measure_rss=True)
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    failure = _head_failure(run, "output")
    assert "64 MiB" in failure["message"]
    assert run.peak_rss_kib is not None and run.peak_rss_kib < 1_500_000  # KiB: the bot stayed bounded


@pytest.mark.timing
def test_a_head_that_floods_stdout_forever_is_stopped_at_the_cap_not_the_time_limit(lab: Lab):
    fb.add_branch(lab.repo, fb.flood_branch(None))
    rules_dir = write_rules(lab.root / "rules-flood", lab.sha256, run_timeout_s=15)
    run = evaluate(
        lab, "flood-forever", "--no-spec", "--no-accuracy", "--max-pairs", "2", rules_dir=rules_dir
    )
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.why
    _head_failure(run, "output")
    assert run.elapsed_s < 12


@pytest.mark.timing
def test_the_trusted_harness_comes_from_main_whatever_the_bots_working_directory(lab: Lab):
    repo_root = Path(__file__).resolve().parents[2]
    assert (repo_root / "engine" / "__init__.py").is_file()
    run = evaluate(lab, "speedup", "--no-spec", "--no-accuracy", "--max-pairs", "8", cwd=repo_root)
    # a harness taken from the working directory fails to import or judges the wrong code; noise on a
    # shared 2-core box can leave the 3x speedup unresolved (INCONCLUSIVE, measured again), never more
    assert run.measurements["failures"] == [] and run.verdict["status"] in ("PASS", "INCONCLUSIVE"), (
        run.verdict["reasons"]
    )
    assert all(e["ratio"] > 1.5 for e in run.decode_estimates().values()), run.decode_estimates()


@pytest.mark.timing
@pytest.mark.parametrize("branch", ["clock", "clock-shift", "inflated-record"])
def test_an_engine_that_lies_about_its_own_speed_is_measured_as_it_is(lab: Lab, branch: str):
    """A clock that runs slow, a clock that moves decode seconds into load, records that inflate the
    rate: the engine's own numbers are diagnostics; the harness's clock measures the real (equal) speed."""
    run = evaluate(
        lab, branch, "--no-spec", "--no-accuracy", "--max-pairs", "8"
    )  # honest or not: no power needed
    _assert_measured_honestly(run)
    if branch != "inflated-record":  # its serve summaries are honest: only a record it never prints lies
        assert any("away from the harness's clock" in d for d in run.measurements["diagnostics"]), (
            run.measurements["diagnostics"]
        )


@pytest.mark.parametrize("branch", ["layer-skip", "layer-skip-long", "harness-detect"])
def test_a_decode_shortcut_fails_the_audit_of_its_timed_tokens(lab: Lab, branch: str):
    """Decode steps that skip a layer (always, past 256 positions only, or only when the engine thinks it
    is measured): prefill and `score` stay exact, the timed tokens do not, and the audit says where."""
    run = evaluate(lab, branch, "--no-spec", "--max-pairs", "8")  # the audit decides whatever the noise
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.verdict
    failed = {(g["name"], g["context"]) for g in run.failed_gates()}
    assert ("decode agreement", 512) in failed, failed
    if branch == "layer-skip-long":
        assert ("decode agreement", 128) not in failed  # short contexts are exact: the audit sees ctx 512
    gate = next(g for g in run.failed_gates() if g["name"] == "decode agreement" and g["context"] == 512)
    assert "position" in gate["detail"] and "margin" in gate["detail"]
    assert run.verdict["tier"] is None and "accuracy-fail" in run.verdict["labels_add"]


@pytest.mark.timing
def test_tokens_computed_up_front_and_streamed_in_a_burst_gain_nothing(lab: Lab):
    """The continuation computed with the prompt, then handed out at once: the harness sees a slow
    prefill and a burst, not a fast decode."""
    run = evaluate(lab, "burst", "--no-spec", "--no-accuracy", "--max-pairs", "8")
    assert run.code == 1 and run.verdict["status"] == "REJECT", run.verdict
    reasons = " ".join(run.verdict["reasons"])
    assert "burst" in reasons or any(
        g["name"] == "no regression" and not g["passed"] for g in run.verdict["gates"]
    )
    assert run.verdict["tier"] is None


@pytest.mark.timing
def test_a_busy_thread_in_the_head_cannot_slow_main(lab: Lab):
    """Threads that spin whenever the head is idle are frozen with it while main is timed."""
    control = evaluate(lab, "speedup", "--no-spec", "--no-accuracy", "--max-pairs", "8")
    run = evaluate(lab, "busy-thread", "--no-spec", "--no-accuracy", "--max-pairs", "8")
    assert run.measurements["failures"] == [], run.measurements["failures"]
    # Two spinning threads beside main's one on a 2-core box leave main 2/3 of its core: its CPU seconds
    # per wall second (measured in the same run, so the box's drift cancels) fall to ~0.67, and its rate to
    # about half. Main's own share is the sharp check; the rate against the control run, an evaluation
    # earlier, only catches the halving (the box drifted 30% between two runs once, 2026-12-07).
    share = {e["context"]: e for e in run.verdict["estimates"] if e["metric"] == UTILIZATION_METRIC}
    for ctx, e in run.decode_estimates().items():
        assert share[ctx]["base_median"] > 0.85, (
            f"ctx {ctx}: main ran {share[ctx]['base_median']:.2f} of its wall"
        )
        base = control.decode_estimates()[ctx]["base_median"]
        assert e["base_median"] > 0.55 * base, (
            f"ctx {ctx}: main at {e['base_median']:.2f} tok/s, {base:.2f} before"
        )
    _assert_no_fabricated_gain(run)


@pytest.mark.timing
def test_a_head_cannot_carry_state_from_one_run_to_the_next(lab: Lab):
    run = evaluate(lab, "memo", "--no-spec", "--no-accuracy", "--max-pairs", "8")
    _assert_no_fabricated_gain(run)
