"""evalbot.render: golden PR comments, escaping of contributor text, the embedded state, result.json previews.

Set EVALBOT_UPDATE_GOLDEN=1 to rewrite tests/evalbot/golden/*.md from the current output (then review the diff).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from evalbot import render
from evalbot.codec import to_dict
from evalbot.model import (
    AccuracyResult,
    ContextEstimate,
    Failure,
    Gate,
    Measurements,
    Provenance,
    Side,
    SpecResult,
    Status,
    ThroughputPairs,
    Verdict,
)

GOLDEN = Path(__file__).parent / "golden"
MODEL = "qwen2.5-coder-0.5b"
MODEL_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
TARGET, TARGET_SHA = "qwen2.5-coder-1.5b", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
BASE, HEAD, HARNESS = (
    "3f9c2a1be07d4c55a1e2f8b6d9c0a7e4f1b2c3d4",
    "8e1d7c4a92b0f3e6d5c4b3a2918f7e6d5c4b3a21",
    "c0ffee" + "5" * 34,
)
RULES = "9a7b" + "0" * 60
SIGNED = "signed by evalbot-2025-03"
NO_REGRESSION_BAR = "CI upper bound >= 0.98x main"


def _provenance(
    pr=42, title="Flash-decode: split-KV for long contexts", author="alice", branch="alice/split-kv", **extra
):
    return Provenance(
        repo="acme/engine",
        base_sha=BASE,
        head_sha=HEAD,
        harness_sha=HARNESS,
        rules_hash=RULES,
        profile="cpu",
        model_sha256s={MODEL: MODEL_SHA},
        engine_build={"base": {"wheel_sha256": "1" * 64}, "head": {"wheel_sha256": "2" * 64}},
        box={"cpu": "AMD EPYC 9654 (16 threads)", "os": "Linux 6.8", "python": "3.12.3"},
        prompt_seed=918273,
        corpus_sha256="7" * 64,
        started_at="2025-03-01T12:00:00Z",
        finished_at="2025-03-01T12:41:07Z",
        pr=pr,
        title=title,
        author=author,
        branch=branch,
        **extra,
    )


def _reproduce(pr=42):
    return f"evalbot evaluate --repo acme/engine --pr {pr} --base {BASE[:12]} --head {HEAD[:12]} --profile cpu --seed 918273"


def _throughput(ctx, pairs):
    return ThroughputPairs(MODEL, ctx, "decode_tps", tuple(pairs))


def _estimate(ctx, pairs, ratio, ci, mde, *, tier=None, regression=False):
    base = sorted(b for b, _ in pairs)
    head = sorted(h for _, h in pairs)
    mid = len(pairs) // 2
    return ContextEstimate(
        model=MODEL,
        context=ctx,
        metric="decode_tps",
        n=len(pairs),
        base_median=(base[mid - 1] + base[mid]) / 2 if len(pairs) % 2 == 0 else base[mid],
        head_median=(head[mid - 1] + head[mid]) / 2 if len(pairs) % 2 == 0 else head[mid],
        ratio=ratio,
        ci_low=ci[0],
        ci_high=ci[1],
        mde=mde,
        tier=tier,
        regression=regression,
        guarded=True,
        scored=True,
    )


def _no_regression(ctx, ci_high):
    return Gate("no regression", ci_high, NO_REGRESSION_BAR, ci_high >= 0.98, context=ctx, model=MODEL)


# Interleaved (main, PR) decode tok/s on the cpu profile; the estimates below are evalbot.stats on them.
P1_128 = [(41.67, 40.16), (41.96, 40.03), (41.85, 40.31), (43.07, 40.8), (43.15, 40.82), (42.83, 40.8),
          (41.72, 41.06), (42.66, 40.74), (41.33, 39.45), (41.47, 39.81), (41.79, 39.74), (41.64, 39.22)]  # fmt: skip
P1_512 = [(36.54, 38.62), (36.35, 39.5), (37.1, 39.48), (36.74, 38.74), (36.95, 39.14), (37.41, 39.32),
          (36.86, 38.69), (36.7, 39.57), (36.38, 38.9), (36.69, 37.86), (36.28, 38.9), (35.17, 37.91),
          (35.8, 37.49), (35.94, 37.7), (35.05, 38.05), (35.99, 38.13)]  # fmt: skip
P2_128 = [(42.41, 42.46), (42.12, 42.03), (42.58, 42.56), (42.31, 42.47), (42.2, 42.9), (43.19, 42.28),
          (41.94, 43.17), (43.02, 43.16), (41.39, 41.63), (42.07, 42.11)]  # fmt: skip
P2_512 = [(35.99, 37.79), (37.04, 37.72), (36.94, 38.05), (37.61, 38.29), (37.3, 38.36), (36.55, 38.66),
          (37.42, 38.3), (36.2, 37.72), (37.04, 37.08), (36.44, 37.91), (35.79, 37.88), (36.23, 36.99)]  # fmt: skip
P4_128 = [(41.96, 42.38), (42.13, 42.91), (41.98, 42.36), (43.04, 42.77), (42.16, 43.36), (43.39, 42.66),
          (41.86, 42.75), (42.33, 42.51)]  # fmt: skip
P4_512 = [(37.02, 36.35), (37.2, 36.48), (36.5, 37.54), (37.52, 37.81), (37.26, 37.58), (37.19, 37.79),
          (36.98, 37.59), (37.18, 37.33), (37.07, 37.39), (37.39, 37.05)]  # fmt: skip
P5_128 = [(41.62, 43.81), (42.07, 44.67), (42.17, 44.69), (43.29, 43.58), (42.14, 44.94), (42.8, 44.96),
          (42.38, 45.07), (42.52, 44.38), (43.22, 44.53), (41.69, 44.05), (41.55, 43.78), (40.27, 43.32),
          (41.58, 42.8), (41.0, 43.57)]  # fmt: skip
P5_512 = [(36.71, 39.94), (36.02, 39.47), (36.72, 40.08), (37.42, 38.95), (37.51, 39.54), (37.38, 39.54),
          (37.13, 40.55), (36.87, 39.99), (37.03, 39.76), (36.47, 40.07), (36.64, 39.08), (37.04, 38.51),
          (36.18, 38.65), (35.77, 38.89), (35.75, 38.81), (35.16, 38.02), (36.03, 38.34), (35.61, 38.33),
          (36.66, 39.42), (36.98, 39.02)]  # fmt: skip


def case_guarded_regression():
    """Tier S at ctx 512, but the guarded ctx 128 regresses: REJECT, showing the delta and the gate."""
    m = Measurements(
        provenance=_provenance(),
        throughput=(_throughput(128, P1_128), _throughput(512, P1_512)),
        accuracy=(AccuracyResult(MODEL, 2048, 0.987, 0.0061, 1.0012, 0.988, 0.0058),),
        reproduce=_reproduce(),
    )
    e128 = _estimate(128, P1_128, 0.9561, (0.9491, 0.9630), 0.0102, regression=True)
    e512 = _estimate(512, P1_512, 1.0620, (1.0538, 1.0701), 0.0108, tier="S")
    v = Verdict(
        status=Status.REJECT,
        tier="S",
        scored_context=512,
        gates=(
            _no_regression(128, 0.9630),
            _no_regression(512, 1.0701),
            Gate("accuracy top-1", 0.987, "top-1 agreement >= 0.90", True, model=MODEL),
            Gate("accuracy KL", 0.0061, "mean KL <= 0.10 nats", True, model=MODEL),
        ),
        reasons=(
            "decode at ctx 128 regressed: 0.956x main, CI upper bound 0.963 is below the 0.98 tolerance",
            "tier S at ctx 512 is withheld while a guarded context regresses",
        ),
        labels_add=("evalbot: rejected",),
        estimates=(e128, e512),
        rules_hash=RULES,
        mde=0.0108,
    )
    return v, m, SIGNED


def case_spec_not_lossless():
    """Speculative decoding diverges from plain decoding in 1 of 3 runs (at token 17): REJECT."""
    m = Measurements(
        provenance=_provenance(
            pr=57, title="Speculative: batch the verify step", author="bob", branch="spec-batch-verify"
        ),
        throughput=(_throughput(128, P2_128), _throughput(512, P2_512)),
        spec=(
            SpecResult(
                target=TARGET,
                drafter=MODEL,
                block_size=7,
                runs=3,
                lossless_runs=2,
                first_divergence=17,
                base_tau=3.12,
                head_tau=3.30,
                ar_pairs=((14.21, 14.30), (14.05, 14.12), (14.33, 14.29)),
                spec_pairs=((29.8, 33.1), (30.2, 33.4), (29.5, 32.7)),
            ),
        ),
        reproduce=_reproduce(57),
    )
    v = Verdict(
        status=Status.REJECT,
        tier=None,
        scored_context=None,
        gates=(
            _no_regression(128, 1.0129),
            _no_regression(512, 1.0435),
            Gate(
                "spec lossless",
                2.0,
                "3 of 3 runs identical to plain decoding",
                False,
                model=TARGET,
                detail="run 2 first differs from plain decoding at token 17",
            ),
            Gate("spec tau", 1.0577, "tau >= 0.95x main", True, model=TARGET),
        ),
        reasons=(
            "speculative decoding is not lossless: 2 of 3 runs match plain decoding; run 2 diverges at token 17",
        ),
        labels_add=("evalbot: rejected",),
        estimates=(
            _estimate(128, P2_128, 1.0036, (0.9944, 1.0129), 0.0129),
            _estimate(512, P2_512, 1.0323, (1.0212, 1.0435), 0.0152),
        ),
        rules_hash=RULES,
        mde=0.0152,
    )
    return v, m, SIGNED


BUILD_LOG = """\
Processing /work/checkout
  Building wheel for engine (pyproject.toml): started
  \x1b[31merror\x1b[0m: subprocess-exited-with-error

  × Building wheel for engine (pyproject.toml) did not run successfully.
  │ exit code: 1
  ╰─> [7 lines of output]
      running build_ext
      building 'engine._fastops' extension
      gcc -O3 -c engine/_fastops.c -o build/_fastops.o
      gcc: fatal error: cannot execute 'cc1': execvp: No such file or directory
      ```
      </details> <!-- @maintainers `` ```` -->
      compilation terminated.
      [end of output]
error: failed-wheel-build-for-install"""


def case_infra_error():
    """Base and head both fail to build with the same toolchain error: the box, not the PR."""
    m = Measurements(
        provenance=_provenance(
            pr=61, title="Fuse RMSNorm into the QKV matmul", author="carol", branch="fuse-rmsnorm"
        ),
        failures=(
            Failure(Side.BASE, "toolchain", "building main failed: gcc cannot execute 'cc1'", BUILD_LOG),
            Failure(Side.HEAD, "toolchain", "building the PR failed: gcc cannot execute 'cc1'", BUILD_LOG),
        ),
        reproduce=_reproduce(61),
    )
    v = Verdict(
        status=Status.INFRA_ERROR,
        tier=None,
        scored_context=None,
        gates=(),
        reasons=("main and the PR both failed to build with the same toolchain error",),
        labels_add=("evalbot: infra-error",),
        rules_hash=RULES,
    )
    return v, m, "unsigned"


def case_accuracy_failure():
    """Top-1 agreement 0.71 < 0.90 and mean KL 0.34 > 0.10 against llama.cpp: REJECT."""
    m = Measurements(
        provenance=_provenance(
            pr=73, title="Use fp16 accumulation in attention", author="dave", branch="fp16-acc"
        ),
        throughput=(_throughput(128, P4_128), _throughput(512, P4_512)),
        accuracy=(AccuracyResult(MODEL, 2048, 0.71, 0.34, 1.213, 0.988, 0.0058),),
        reproduce=_reproduce(73),
    )
    v = Verdict(
        status=Status.REJECT,
        tier=None,
        scored_context=None,
        gates=(
            _no_regression(128, 1.0210),
            _no_regression(512, 1.0154),
            Gate("accuracy top-1", 0.71, "top-1 agreement >= 0.90", False, model=MODEL),
            Gate("accuracy KL", 0.34, "mean KL <= 0.10 nats", False, model=MODEL),
        ),
        reasons=("logits drift from llama.cpp: top-1 agreement 0.71 < 0.90 and mean KL 0.34 > 0.10",),
        labels_add=("evalbot: rejected",),
        estimates=(
            _estimate(128, P4_128, 1.0085, (0.9961, 1.0210), 0.0172),
            _estimate(512, P4_512, 1.0042, (0.9932, 1.0154), 0.0155),
        ),
        rules_hash=RULES,
        mde=0.0172,
    )
    return v, m, SIGNED


INJECTED_TITLE = "Fast **decode** <img src=x onerror=alert(1)> @maintainers | fixes #1"


def case_pass_injection():
    """A PASS (tier M) whose title, branch and login try markdown, HTML and @-mention injection."""
    m = Measurements(
        provenance=_provenance(pr=88, title=INJECTED_TITLE, author="@evil", branch="feat/`rm -rf`"),
        throughput=(_throughput(128, P5_128), _throughput(512, P5_512)),
        accuracy=(AccuracyResult(MODEL, 2048, 0.986, 0.0063, 1.0009, 0.988, 0.0058),),
        reproduce=_reproduce(88),
    )
    v = Verdict(
        status=Status.PASS,
        tier="M",
        scored_context=512,
        gates=(
            _no_regression(128, 1.0614),
            _no_regression(512, 1.0820),
            Gate("accuracy top-1", 0.986, "top-1 agreement >= 0.90", True, model=MODEL),
            Gate("accuracy KL", 0.0063, "mean KL <= 0.10 nats", True, model=MODEL),
        ),
        reasons=("tier M at ctx 512: CI lower bound +6.5% >= +6.0%",),
        labels_add=("evalbot: tier-M", "evalbot: passed"),
        estimates=(
            _estimate(128, P5_128, 1.0508, (1.0403, 1.0614), 0.0142, tier="S"),
            _estimate(512, P5_512, 1.0737, (1.0655, 1.0820), 0.0109, tier="M"),
        ),
        rules_hash=RULES,
        mde=0.0142,
    )
    return v, m, SIGNED


NOISY_128 = [(40.1, 44.9), (43.2, 41.0), (39.8, 42.6), (44.0, 42.2), (41.5, 44.8), (42.9, 41.7)]
NOISY_512 = [(36.0, 37.9), (37.5, 36.2), (35.1, 37.4), (37.9, 36.8), (36.2, 38.8), (37.0, 36.1)]
REFERENCE = {
    "engine": "llama.cpp",
    "cached": False,
    "llama_cpp_python": "0.3.36",
    "pinned_version": "0.3.36",
    "cmake_args": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF",
    "build_key": "0123456789ab",
    "libs": {"libggml-cpu.so": "e" * 64},
    "lib_sha256": "e" * 64,
    "features": ["AVX", "AVX2", "F16C", "FMA"],
}


def case_inconclusive_noisy_box():
    """A/B pairs too noisy to resolve the +2% tier floor: INCONCLUSIVE (measured again), with the box's
    state across the pairs and the reference's identity in the provenance block."""
    from evalbot.rules import default_rules_dir, load_rules
    from evalbot.verdict.decide import decide

    samples = tuple(
        {
            "model": MODEL,
            "context": ctx,
            "pair": i + 1,
            "at": f"2025-03-01T12:0{i}:00Z",
            "load1": 1.1 + 0.1 * i,
            "other_cores": 0.02 * i,
            "during_other_cores": 0.05 + 0.01 * i,
            "waited_s": 0.0 if i else 31.5,
            "others_top": ["kworker/0:1 0.01"],
        }
        for ctx in (128, 512)
        for i in range(6)
    )
    m = Measurements(
        provenance=_provenance(
            pr=73,
            title="Unroll the dequant loop",
            author="dave",
            branch="unroll",
            reference={MODEL: REFERENCE},
        ),
        throughput=(_throughput(128, NOISY_128), _throughput(512, NOISY_512)),
        accuracy=(AccuracyResult(MODEL, 128, 0.984, 0.0021, 1.004, 0.984, 0.0021),),
        reproduce=_reproduce(73),
        box_samples=samples,
    )
    v = decide(m, load_rules(default_rules_dir()))
    assert v.status is Status.INCONCLUSIVE
    return v, m, "unsigned"


# --- #39: the contest's cases, decided by verdict.decide under the shipped rules ---------------------


def _paired(ratio, n=12, base=40.0, noise=0.004, seed=0):
    import random as _random

    rng = _random.Random(seed)
    return tuple((round(base * (1 + rng.gauss(0, noise)), 3), round(base * ratio * (1 + rng.gauss(0, noise)), 3))
                 for _ in range(n))  # fmt: skip


def _two_models(small, large, **prov):
    tps = tuple(
        ThroughputPairs(model, ctx, "decode_tps", _paired(ratio, base=base, seed=ctx + i))
        for i, (model, ratio, base) in enumerate(((MODEL, small, 41.0), (TARGET, large, 14.2)))
        for ctx in (128, 512)
    )
    acc = (
        AccuracyResult(MODEL, 128, 0.984, 0.0021, 1.004, 0.984, 0.0021, ppl=9.412, base_ppl=9.405, reference_ppl=9.374),
        AccuracyResult(TARGET, 128, 0.991, 0.0012, 1.002, 0.991, 0.0012, ppl=7.118, base_ppl=7.118, reference_ppl=7.104),
    )  # fmt: skip
    provenance = replace(_provenance(**prov), profile="cpu-both", model_sha256s={MODEL: MODEL_SHA, TARGET: TARGET_SHA},
                         box={"cpu": "Intel Xeon Platinum 8481C", "cores": 2, "os": "Linux 6.8", "gpu": None})  # fmt: skip
    return Measurements(
        provenance=provenance, throughput=tps, accuracy=acc, reproduce=_reproduce(prov.get("pr", 42))
    )


def case_pass_two_models():
    """Both registry models on the cpu-both profile: a label per model, the overall label the best, absolute
    figures beside main's, PPL as PR / main, the box named, and auto-merge off said."""
    from evalbot.rules import default_rules_dir, load_rules
    from evalbot.verdict.decide import decide

    m = _two_models(
        1.045, 1.075, pr=81, title="Fuse the dequant into the matvec", author="erin", branch="fuse"
    )
    v = decide(m, load_rules(default_rules_dir()))
    assert v.status is Status.PASS and {"perf-0.5b:S", "perf-1.5b:M", "perf:M"} <= set(v.labels_add)
    standing = render.Standing(merge="auto-merge is off in rules/automerge.yaml: a maintainer merges")
    return v, m, SIGNED, standing


def case_reject_guard_other_model():
    """The 0.5B 10% faster, the 1.5B 5% slower: the guard on the other model REJECTs."""
    from evalbot.rules import default_rules_dir, load_rules
    from evalbot.verdict.decide import decide

    m = _two_models(
        1.10, 0.95, pr=82, title="Special-case the 0.5B's head dim", author="mallory", branch="hd64"
    )
    v = decide(m, load_rules(default_rules_dir()))
    assert v.status is Status.REJECT and "regression" in v.labels_add
    return v, m, SIGNED


def case_pass_spec_tier():
    """A better drafter: speculative tok/s up 25% with tau up and plain decode unchanged, lossless in every
    run: a speculative tier and no decode tier."""
    from evalbot.rules import default_rules_dir, load_rules
    from evalbot.verdict.decide import decide

    spec = tuple(
        SpecResult(
            MODEL,
            "ngram-3",
            7,
            6,
            6,
            None,
            2.10,
            2.85,
            ar_pairs=_paired(1.0, 6, seed=ctx),
            spec_pairs=_paired(1.25, 6, base=63.0, seed=ctx + 1),
            context=ctx,
            base_tau_runs=(2.1,) * 6,
            head_tau_runs=(2.85,) * 6,
            base_tau_steps=(2,) * 60,
            head_tau_steps=(3,) * 60,
            spec_blocks=(1, 1, 2, 2, 3, 3),  # spread over the A/B's blocks 1-3
        )
        for ctx in (128, 512)
    )
    m = Measurements(
        provenance=_provenance(
            pr=83, title="N-gram drafter: longest suffix first", author="frank", branch="ngram"
        ),
        throughput=tuple(
            ThroughputPairs(MODEL, c, "decode_tps", _paired(1.0, seed=c + 7)) for c in (128, 512)
        ),
        accuracy=(AccuracyResult(MODEL, 128, 0.984, 0.0021, 1.004, 0.984, 0.0021, ppl=9.41, base_ppl=9.41),),
        spec=spec,
        reproduce=_reproduce(83),
    )
    v = decide(m, load_rules(default_rules_dir()))
    assert v.status is Status.PASS and v.tier is None and "perf-spec:XL" in v.labels_add
    return v, m, SIGNED


CASES = {
    "inconclusive_noisy_box": case_inconclusive_noisy_box,
    "reject_guarded_regression": case_guarded_regression,
    "reject_spec_not_lossless": case_spec_not_lossless,
    "infra_error_toolchain": case_infra_error,
    "reject_accuracy": case_accuracy_failure,
    "pass_injection": case_pass_injection,
    "pass_two_models": case_pass_two_models,
    "reject_guard_other_model": case_reject_guard_other_model,
    "pass_spec_tier": case_pass_spec_tier,
}


def _render(name):
    verdict, measurements, signature, *standing = CASES[name]()
    return render.render_comment(
        verdict, measurements, signature_status=signature, standing=(standing or [None])[0]
    )


def _outside_fences(text):
    """The lines of text that are markdown, not the inside of fenced code blocks."""
    lines, fence = [], None
    for line in text.split("\n"):
        if fence is None:
            m = re.match(r"(`{3,})", line)
            if m:
                fence = m.group(1)
            else:
                lines.append(line)
        elif line.strip() == fence:
            fence = None
    assert fence is None, "unclosed code fence"
    return lines


# --- goldens -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    out = _render(name)
    path = GOLDEN / f"{name}.md"
    if os.environ.get("EVALBOT_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(out, encoding="utf-8")
    assert path.exists(), f"no golden {path.name}; run with EVALBOT_UPDATE_GOLDEN=1 and review it"
    assert out == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CASES))
def test_comment_is_inert_markdown(name):
    out = _render(name)
    assert out.startswith(render.MARKER + "\n")
    markdown = _outside_fences(out)
    text = "\n".join(markdown)
    # Only the bot's own tags: no contributor HTML, and only the two hidden comments.
    tags = set(re.findall(r"<(/?[a-zA-Z!][^\s>]*)", text))
    assert tags <= {"!--", "details", "/details", "summary", "/summary", "sub", "/sub", "br"}, tags
    assert text.count("<!--") == 2 and text.count("-->") == 2
    # Every @ outside code is broken by a zero-width space, so nobody is pinged.
    assert re.findall(r"@(?!&#8203;)", text) == []
    # "#12" links (and cross-references) issue 12; the only "#<digit>" left are the PR's own and entities.
    assert not re.search(r"(?<!&)#\d", text.replace("**PR #", "")), "live issue reference"
    # Tables keep their shape: each row has as many unescaped pipes as its header.
    width = None
    for line in markdown:
        if line.startswith("|"):
            pipes = len(re.findall(r"(?<!\\)\|", line))
            width = width or pipes
            assert pipes == width, line
        else:
            width = None
    assert "+0.0%" not in out and "-0.0%" not in out


def test_injection_is_neutralized():
    out = _render("pass_injection")
    assert "<img" not in out and "**decode**" not in out
    assert (
        "Fast \\*\\*decode\\*\\* &lt;img src=x onerror=alert(1)&gt; @&#8203;maintainers \\| fixes \\#&#8203;1"
        in out
    )
    assert "by @&#8203;evil" in out
    assert "branch feat/\\`rm -rf\\`" in out
    assert "@maintainers" not in out and "@evil" not in out


def test_reject_shows_delta_and_failing_gate():
    out = _render("reject_guarded_regression")
    assert "ctx 128: 0.956× (-4.4%) [-5.1%, -3.7%]" in out
    assert "- ✗ no regression (qwen2.5-coder-0.5b · ctx 128): measured 0.963" in out
    assert "— (S withheld)" in out


def test_infra_error_says_whose_fault_and_fences_logs():
    out = _render("infra_error_toolchain")
    assert "infrastructure problem, not a problem with this PR" in out
    assert "| base | toolchain |" in out and "| head | toolchain |" in out
    assert "\x1b" not in out
    # The log holds a run of four backticks, so its fence needs five.
    assert out.count("`````text\n") == 2
    assert "      </details> <!-- @maintainers `` ```` -->" in out


def test_a_report_that_knows_only_the_pr_number_names_it_without_placeholders():
    """The eval workflow's job summary is rendered by `evalbot evaluate --pr N`, which knows no title or
    author: the header names the PR and nothing it does not know (it read "(no title) · by (unknown)")."""
    v, m, sig = case_guarded_regression()
    bare = replace(m, provenance=_provenance(pr=7, title="", author="", branch=""))
    out = render.render_comment(v, bare, signature_status=sig)
    header = next(line for line in out.splitlines() if line.startswith("**PR"))
    assert header == "**PR #7**"
    assert "(no title)" not in out and "(unknown)" not in out
    # a local run (make demo: no PR at all) names nothing in its place; the next line names both commits
    local = render.render_comment(
        v, replace(m, provenance=_provenance(pr=None, title="", author="", branch="")), signature_status=sig
    )
    assert not any(line.startswith("**PR") for line in local.splitlines())
    assert "main `" in local and "vs PR `" in local
    full = render.render_comment(v, m, signature_status=sig)
    assert "**PR #42**: Flash-decode: split-KV for long contexts · by alice · branch alice/split-kv" in full


def test_skipped_shows_reason():
    v, m, _ = case_infra_error()
    m = Measurements(provenance=m.provenance, skipped_reason="PR touches rules/ (a sensitive path)")
    v = Verdict(Status.SKIPPED, None, None, (), (), ())
    out = render.render_comment(v, m, signature_status="unsigned")
    assert "⏭️ SKIPPED" in out and "PR touches rules/ (a sensitive path)" in out
    assert "Method:" not in out and "Throughput" not in out


# --- state ---------------------------------------------------------------------------------------


def test_state_round_trips_even_with_comment_closers():
    v, m, sig = case_guarded_regression()
    v = Verdict(**{**v.__dict__, "reasons": ("sneaky --> <!-- evalbot:state e30= --> reason",)})
    out = render.render_comment(v, m, signature_status=sig)
    state = render.find_state(out)
    assert state == render.comment_state(v, m, signature_status=sig)
    assert state["status"] == v.status.value and state["tier"] == v.tier and state["head_sha"] == HEAD
    assert "verdict" not in state and "reasons" not in json.dumps(state)  # keys only, never the text
    assert out.count("-->") == 2  # the reason's own "-->" was escaped in the visible text


@pytest.mark.parametrize(
    "body",
    [
        "",
        "no state here",
        "<!-- evalbot:state !!! -->",
        "<!-- evalbot:state bm90IGpzb24= -->",
        "<!-- evalbot:state WzFd -->",
    ],
)
def test_find_state_rejects_missing_or_garbled(body):
    assert render.find_state(body) is None


# --- escaping ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("plain text 1.5", "plain text 1.5"),
        ("a|b", "a\\|b"),
        ("**bold** _it_ ~~s~~", "\\*\\*bold\\*\\* \\_it\\_ \\~\\~s\\~\\~"),
        ("[x](javascript:alert(1))", "\\[x\\](javascript:alert(1))"),
        ("`code`", "\\`code\\`"),
        ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
        ("</details>", "&lt;/details&gt;"),
        ("&#64;someone &amp;", "&amp;\\#&#8203;64;someone &amp;amp;"),
        ("@someone and @org/team", "@&#8203;someone and @&#8203;org/team"),
        ("fixes #12, acme/engine#3, GH-4", "fixes \\#&#8203;12, acme/engine\\#&#8203;3, GH&#8203;-4"),
        (
            "see https://evil.example and www.evil.example",
            "see https&#8203;://evil.example and www&#8203;.evil.example",
        ),
        ("# heading", "\\# heading"),
        ("- item", "\\- item"),
        ("+ item", "\\+ item"),
        ("12. item", "12\\. item"),
        ("3) item", "3\\) item"),
        ("===", "\\==="),
        ("--- ", "\\---"),
        ("-4.4% and 3.12.3", "-4.4% and 3.12.3"),
        ("1.5x faster", "1.5x faster"),
        ("$x^2$", "\\$x^2\\$"),
        ("a\\b", "a\\\\b"),
        ("line one\nline two\r\n\t three", "line one line two three"),
        ("a\u2028b\u2029c", "a b c"),
        ("\u202eevil\u202c name\x00\x07", "evil name"),
        ("\x1b[31mred\x1b[0m", "red"),
        ("", ""),
        (None, "—"),
    ],
)
def test_escape_md(raw, escaped):
    assert render.escape_md(raw) == escaped


def test_escape_md_limit_cuts_before_escaping():
    assert render.escape_md("abcdef|ghij", limit=8) == "abcdef\\|…"
    assert render.escape_md("short", limit=8) == "short"


def test_fenced_outruns_backticks_and_keeps_the_tail():
    block = render.fenced("a ``` b\n`````\nc", "text")
    assert block.startswith("``````text\n") and block.endswith("\n``````")
    tail = render.fenced("\n".join(f"line {i}" for i in range(100)), max_lines=3)
    assert tail == "```text\n[… 97 earlier lines omitted]\nline 97\nline 98\nline 99\n```"


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.047, "+4.7%"),
        (-0.0439, "-4.4%"),
        (0.0042, "+0.42%"),
        (-0.0004, "-0.04%"),
        (0.0, "0.00%"),
        (0.25, "+25.0%"),
    ],
)
def test_percentages(fraction, text):
    assert render._pct(fraction) == text


def test_ratio_and_ci_formats():
    assert render._ratio(1.0471) == "1.047×"
    assert render._ci(1.021, 1.073) == "[+2.1%, +7.3%]"
    assert render._ci(0.9961, 1.0021) == "[-0.39%, +0.21%]"


# --- result.json previews ------------------------------------------------------------------------


def test_render_verdict_file(tmp_path):
    v, m, sig = case_spec_not_lossless()
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"measurements": to_dict(m), "verdict": to_dict(v), "signature_status": sig}))
    assert render.render_verdict_file(path) == render.render_comment(v, m, signature_status=sig)
    path.write_text(json.dumps({"measurements": to_dict(m), "verdict": to_dict(v)}))
    assert "Receipt: unsigned." in render.render_verdict_file(path)
    path.write_text(json.dumps({"verdict": to_dict(v)}))
    with pytest.raises(ValueError, match="measurements"):
        render.render_verdict_file(path)


def test_render_verdict_file_reads_a_result_json_written_before_labels_remove_was_retired():
    """docs/results keeps real result.json files from bots that still wrote the verdict's labels_remove."""
    path = (
        Path(__file__).parents[2]
        / "docs/results/cpu_judge_epyc_2026-12-04/night_patches/speedup1/result.json"
    )
    assert "labels_remove" in json.loads(path.read_text(encoding="utf-8"))["verdict"]
    assert "PASS" in render.render_verdict_file(path)


def test_box_summary_gives_the_ranges_across_pairs():
    from evalbot.render import box_summary

    assert box_summary(()) == ""
    cpu = ({"load1": 0.8, "at": "t"}, {"load1": 1.4}, {"load1": None})
    assert box_summary(cpu) == "3 samples, load 0.8–1.4"
    gpu = (
        {"load1": 1.0, "gpu_clock_sm": "1980 MHz", "gpu_temp": "41"},
        {"load1": 1.0, "gpu_clock_sm": "1755 MHz", "gpu_temp": "44"},
    )
    assert box_summary(gpu) == "2 samples, load 1, GPU SM clock 1755–1980, GPU 41–44 °C"


def test_notice_carries_the_marker_and_state_and_escapes_contributor_text():
    body = render.render_notice(pr=5, head_sha="c" * 40, title="not evaluated (sensitive_paths)",
                         lines=["touches `rules/gates.yaml` <img src=x onerror=alert(1)>"], kind="skip",
                         author="eve_[bot]")  # fmt: skip
    assert body.startswith(render.MARKER)
    assert render.find_state(body) == {"schema": 2, "pr": 5, "head_sha": "c" * 40, "notice": "skip"}
    assert "<img" not in body and "&lt;img" in body and "eve\\_" in body


def test_every_rules_prose_has_its_template_and_escapes_what_a_contributor_wrote():
    """The intake rules decide in code and speak through templates/notices/: each template a rule names
    exists, and a contributor's text in it (logins, paths, reasons) is escaped there."""
    from evalbot.model import Prose
    from evalbot.render import render_prose

    hostile = "@maintainers <img src=x> [x](http://evil)"
    samples = [
        Prose.of("blocklist", logins=("bad_actor", hostile)),
        Prose.of("cap", cap=5, position=6),
        Prose.of("complete", why=hostile),
        Prose.of("sensitive_paths", paths=("evalbot/x.py", hostile), more=3),
        Prose.of("exhausted", count=4, limit=3),
        Prose.of("stale", days=40),
        Prose.of(
            "benchmark_needed", why=hostile, commands=("python -m engine bench --ctx 512",), required=True
        ),
        Prose.of("infra", reason=hostile),
    ]
    used = {p.template for p in samples}
    shipped = {
        f.name.removesuffix(".md.j2")
        for f in (Path(__file__).parents[2] / "evalbot/templates/notices").iterdir()
    }
    assert used == shipped
    for p in samples:
        text = render_prose((p,))
        assert text and "{{" not in text
        assert "@maintainers" not in text and "<img" not in text and "[x](http" not in text
    both = render_prose(samples[:2])
    assert both == render_prose(samples[:1]) + "\n\n" + render_prose(samples[1:2])
    assert "- … and 3 more" in render_prose(samples[3:4])
