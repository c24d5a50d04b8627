"""rules/*.yaml -> Rules: the shipped defaults, the hash, and errors that point at file, line and field."""

from __future__ import annotations

import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evalbot.rules import (
    FILES,
    OPTIONAL_FILES,
    RulesError,
    automerge_allowed,
    default_rules_dir,
    load_rules,
    rules_hash,
)
from evalbot.stats import PairedEstimate, classify


def tier_for_ci_low(rules, ci_low: float) -> str | None:
    """The tier the verdict's rule (stats.classify over the rules' tier bounds) gives an estimate whose
    95% CI starts at ci_low, a ratio (None below the first tier)."""
    est = PairedEstimate(10, ci_low * 1.01, ci_low, ci_low * 1.02, 0.01, 0.01, 0.01, 0.5, 0.95, 9)
    return classify(est, rules.tier_bounds, rules.gates.no_regression.min_ratio).tier


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def edit(rules_dir: Path, name: str, old: str, new: str) -> int:
    """Replace the one occurrence of old by new in a rules file; the 1-based line where new starts."""
    path = rules_dir / name
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {name}"
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def load_error(rules_dir: Path) -> RulesError:
    with pytest.raises(RulesError) as info:
        load_rules(rules_dir)
    return info.value


# ---------------------------------------------------------------- the shipped defaults


def test_shipped_defaults(rules):
    assert [(t.name, t.lower_bound, t.label) for t in rules.tiers] == [
        ("XS", 0.02, "perf:XS"),
        ("S", 0.035, "perf:S"),
        ("M", 0.06, "perf:M"),
        ("L", 0.10, "perf:L"),
        ("XL", 0.18, "perf:XL"),
    ]
    g = rules.gates
    assert g.no_regression.min_ratio == 0.98
    assert (g.accuracy.top1_min, g.accuracy.mean_kl_max) == (0.90, 0.10)
    assert (g.spec.lossless_runs_min, g.spec.runs) == (3, 3)
    assert (g.spec.tau_min_ratio, g.spec.ar_speed_min_ratio) == (0.95, 0.98)

    gpu, cpu = rules.profile("gpu"), rules.profile("cpu")
    assert gpu.device == "cuda" and cpu.device == "cpu"
    guarded = {p.name: tuple(c.ctx for c in p.contexts if c.guarded) for p in (gpu, cpu)}
    assert guarded["gpu"] == gpu.scored_contexts == (128, 512, 4096, 16384, 32768)
    assert guarded["cpu"] == (128, 512)
    assert (gpu.measurement.ci_half_width, cpu.measurement.ci_half_width) == (0.0015, 0.004)
    assert (cpu.measurement.pairs_per_block, cpu.measurement.min_blocks) == (2, 6)
    assert gpu.measurement.min_blocks >= 2 and cpu.quiet.max_wait_s > 0 and gpu.quiet.max_gpu_util > 0
    for p in (gpu, cpu):
        m = p.measurement
        assert (
            m.decode_tokens > 0
            and m.warmup_runs >= 0
            and 2 <= m.min_pairs <= m.max_pairs
            and m.time_budget_s > 0
        )

    sha_05b = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    sha_15b = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [(m.name, m.source, m.sha256) for m in cpu.models] == [("qwen2.5-coder-0.5b", "registry", sha_05b)]
    assert "qwen3-8b" in [m.name for m in gpu.models] and all(m.source == "shape" for m in gpu.models)
    sp = rules.spec_pair
    assert (sp.target.name, sp.target.sha256, sp.draft.name, sp.draft.sha256, sp.block) == (
        "qwen2.5-coder-1.5b",
        sha_15b,
        "qwen2.5-coder-0.5b",
        sha_05b,
        7,
    )

    c = rules.copycat
    assert (c.containment.block, c.containment.warn, c.warnings_to_block) == (0.85, 0.75, 3)
    assert (c.tiny_pr.below_added_lines, c.tiny_pr.warn_literal_overlap) == (15, 0.98)
    assert (c.boilerplate_max_prs, c.winnowing.k, c.winnowing.w) == (5, 13, 4)
    assert c.strikes.limit > 0 and c.strikes.window_days > 0

    p = rules.policy
    assert p.open_pr_cap == 5
    assert {a.label: a.weight for a in p.areas} == {
        "area:kernels": 0.42,
        "area:engine": 0.25,
        "area:spec": 0.2,
        "area:other": 0.13,
    }
    assert p.sensitive_paths[:4] == ("evalbot/", "rules/", "bench/", ".github/")
    assert "engine/cli.py" in p.sensitive_paths and "engine/data/" in p.sensitive_paths
    assert p.blocklist == ()
    assert (p.stale.days_without_push, p.stale.max_fruitless_verdicts) == (30, 2)
    assert (p.template.require_benchmark, p.template.claim_gap_max) == (True, 0.05)

    lb = rules.labels
    assert (lb.verified, lb.regression, lb.infra_error, lb.copycat, lb.copycat_warn) == (
        "verified",
        "regression",
        "infra-error",
        "copycat",
        "copycat-warn",
    )
    assert (lb.gaming, lb.needs_rebase, lb.skipped_sensitive) == (
        "flagged:gaming",
        "needs-rebase",
        "skipped:sensitive",
    )
    assert (lb.needs_benchmark, lb.claim_gap, lb.stale, lb.exhausted, lb.merge_first, lb.re_evaluate) == (
        "needs-benchmark",
        "claim-gap",
        "stale",
        "exhausted",
        "merge-first",
        "re-evaluate",
    )
    # A PR waiting on its author, on a maintainer, or on a fresh measurement must not merge by itself.
    assert {"needs-benchmark", "claim-gap", "re-evaluate"} <= set(rules.automerge.blocking_labels)
    assert "merge-first" not in rules.automerge.blocking_labels

    assert rules.automerge.enabled is False
    assert rules.dispatch.mode == "local" and rules.dispatch.runner_public_keys == ()
    d = rules.dispatch
    assert (d.workflow, d.ref, d.timeout_minutes, d.max_attempts) == ("evalbot-eval.yml", "main", 120, 3)
    assert rules.source_dir == default_rules_dir()


def test_rules_are_frozen(rules):
    with pytest.raises(AttributeError):
        rules.gates.accuracy.top1_min = 0.0  # type: ignore[misc]


# ---------------------------------------------------------------- the hash


def test_hash_is_stable_and_covers_content_not_text_or_place(rules, rules_dir):
    assert len(rules.rules_hash) == 64 and rules.rules_hash == rules_hash(rules)
    assert load_rules(default_rules_dir()).rules_hash == rules.rules_hash
    assert load_rules(rules_dir).rules_hash == rules.rules_hash  # another folder, same content

    edit(rules_dir, "gates.yaml", "  top1_min: 0.90 ", "  # a comment\n  top1_min: 0.9 ")  # 0.90 == 0.9
    edit(rules_dir, "tiers.yaml", "  L: 0.10", "  L:     1.0e-1")
    edit(rules_dir, "automerge.yaml", "required_labels: [verified]", "required_labels:\n  - verified")
    assert load_rules(rules_dir).rules_hash == rules.rules_hash

    edit(rules_dir, "gates.yaml", "  top1_min: 0.9 ", "  top1_min: 0.91 ")
    assert load_rules(rules_dir).rules_hash != rules.rules_hash


# ---------------------------------------------------------------- malformations

# (file, old text, new text, field, part of the message); the error's line is where the new text starts,
# or where `at` (the MALFORMED_AT entry, if any) starts.
MALFORMED = [
    pytest.param(
        "gates.yaml",
        "top1_min: 0.90",
        "top1_min: high",
        "gates.accuracy.top1_min",
        "expected a number in [0, 1], got 'high'",
        id="wrong-type",
    ),
    pytest.param(
        "gates.yaml",
        "top1_min: 0.90",
        "top1_min: 1.5",
        "gates.accuracy.top1_min",
        "expected a number in [0, 1], got 1.5",
        id="fraction-out-of-range",
    ),
    pytest.param(
        "profiles.yaml",
        "decode_tokens: 24",
        "decode_tokens: 0",
        "profiles.cpu.measurement.decode_tokens",
        "expected a positive integer, got 0",
        id="non-positive-int",
    ),
    pytest.param(
        "profiles.yaml",
        "min_pairs: 12",
        "min_pairs: 4.5",
        "profiles.cpu.measurement.min_pairs",
        "expected an integer >= 2, got 4.5",
        id="float-for-int",
    ),
    pytest.param(
        "gates.yaml",
        "top1_min: 0.90",
        "top1_mn: 0.90",
        "gates.accuracy.top1_mn",
        "unknown key (did you mean 'top1_min'?)",
        id="unknown-key",
    ),
    pytest.param(
        "tiers.yaml",
        "  M: 0.06",
        "  M: 0.03",
        "tiers.lower_bounds.M",
        "expected a bound above S's 0.035 (tiers rise strictly), got 0.03",
        id="tiers-not-increasing",
    ),
    pytest.param(
        "profiles.yaml",
        "- {ctx: 16384, guarded: true, scored: true}",
        "- {ctx: 512, guarded: true, scored: true}",
        "profiles.gpu.contexts[3].ctx",
        "got 512 again (first on line",
        id="duplicate-context",
    ),
    pytest.param(
        "models.yaml",
        "sha256: 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32\n  gpu",
        "sha256: 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff3Z\n  gpu",
        "models.profiles.cpu[0].sha256",
        "expected a sha256 (64 lowercase hex digits)",
        id="bad-sha256",
    ),
    pytest.param(
        "copycat.yaml",
        "warn: 0.75",
        "warn: 0.90",
        "copycat.containment.warn",
        "expected a number below containment.block (0.85), got 0.9",
        id="copycat-bands-overlap",
    ),
    pytest.param(
        "automerge.yaml",
        "  - copycat-warn",
        "  - copycat-wran",
        "automerge.blocking_labels[5]",
        "got 'copycat-wran' (did you mean 'copycat-warn'?)",
        id="unknown-label-reference",
    ),
    pytest.param(
        "labels.yaml",
        "  XL: perf:XL",
        "  XXL: perf:XL",
        "labels.tiers.XXL",
        "unknown key (did you mean 'XL'?)",
        id="label-for-unknown-tier",
    ),
    pytest.param(
        "automerge.yaml",
        "min_tier: XS",
        "min_tier: XXS",
        "automerge.min_tier",
        "expected a tier (one of: XS, S, M, L, XL), got 'XXS'",
        id="unknown-tier-reference",
    ),
    pytest.param(
        "labels.yaml",
        "copycat_warn: copycat-warn",
        "copycat_warn: copycat",
        "labels.copycat_warn",
        "already labels.copycat",
        id="label-used-twice",
    ),
    pytest.param(
        "automerge.yaml",
        "enabled: false",
        "enabled: 'no'",
        "automerge.enabled",
        "expected true or false, got 'no'",
        id="quoted-boolean",
    ),
    pytest.param(
        "models.yaml",
        "  block: 7",
        "  block: 7\n  block: 8",
        "models.spec.block",
        "duplicate key",
        id="duplicate-key",
    ),
    pytest.param(
        "policy.yaml",
        "weight: 0.13",
        "weight: 0.2",
        "policy.areas",
        "expected weights summing to 1, got 1.07",
        id="area-weights",
    ),
    pytest.param(
        "dispatch.yaml",
        "mode: local",
        "mode: remote",
        "dispatch.mode",
        "expected a dispatch mode (one of: local, actions), got 'remote'",
        id="bad-choice",
    ),
    pytest.param(
        "dispatch.yaml",
        "runner_public_keys: []",
        "runner_public_keys: [c2hvcnQ=]",
        "dispatch.runner_public_keys[0]",
        "expected an Ed25519 public key (base64 of 32 raw bytes), got 'c2hvcnQ='",
        id="bad-public-key",
    ),
    pytest.param(
        "models.yaml",
        "  draft:\n    registry: qwen2.5-coder-0.5b",
        "  draft:\n    shape: qwen2.5-coder-0.5b",
        "models.spec.draft",
        "expected a registry model with 'registry' and 'sha256', got a random-weight shape",
        id="shape-as-spec-draft",
    ),
    pytest.param(
        "models.yaml",
        "  gpu:\n",
        "  gpus:\n",
        "models.profiles.gpus",
        "unknown key (did you mean 'gpu'?); expected one of: gpu, cpu",
        id="unknown-profile-reference",
    ),
    pytest.param(
        "policy.yaml",
        "days_without_push: 30",
        "days_without_push: 0",
        "policy.stale.days_without_push",
        "expected a positive integer, got 0",
        id="stale-days",
    ),
    pytest.param(
        "policy.yaml",
        "max_fruitless_verdicts: 2",
        "max_fruitless_verdicts: -1",
        "policy.stale.max_fruitless_verdicts",
        "expected an integer >= 0, got -1",
        id="fruitless-negative",
    ),
    pytest.param(
        "policy.yaml",
        "require_benchmark: true",
        "require_benchmark: yes please",
        "policy.template.require_benchmark",
        "expected true or false, got 'yes please'",
        id="template-boolean",
    ),
    pytest.param(
        "policy.yaml",
        "claim_gap_max: 0.05",
        "claim_gap_max: 0",
        "policy.template.claim_gap_max",
        "expected a number in (0, 1], got 0",
        id="claim-gap-zero",
    ),
    pytest.param(
        "labels.yaml",
        "merge_first: merge-first",
        "merge_first: needs-rebase",
        "labels.merge_first",
        "already labels.needs_rebase",
        id="new-label-used-twice",
    ),
    pytest.param(
        "automerge.yaml",
        "  - re-evaluate",
        "  - re-evaluated",
        "automerge.blocking_labels[14]",
        "got 're-evaluated' (did you mean 're-evaluate'?)",
        id="new-label-reference",
    ),
    pytest.param(
        "dispatch.yaml",
        "workflow: evalbot-eval.yml",
        "workflow: ../evil.yml",
        "dispatch.workflow",
        "expected a workflow file name in .github/workflows (e.g. evalbot-eval.yml), got '../evil.yml'",
        id="dispatch-workflow-path",
    ),
    pytest.param(
        "dispatch.yaml",
        "ref: main",
        "ref: ''",
        "dispatch.ref",
        "expected a branch or tag name, got ''",
        id="dispatch-ref-empty",
    ),
    pytest.param(
        "dispatch.yaml",
        "timeout_minutes: 120",
        "timeout_minutes: 0",
        "dispatch.timeout_minutes",
        "expected a positive integer, got 0",
        id="dispatch-timeout",
    ),
    pytest.param(
        "dispatch.yaml",
        "max_attempts: 3",
        "max_attempts: many",
        "dispatch.max_attempts",
        "expected a positive integer, got 'many'",
        id="dispatch-attempts",
    ),
    pytest.param(
        "dispatch.yaml",
        "max_attempts: 3",
        "max_attempt: 3",
        "dispatch.max_attempt",
        "unknown key (did you mean 'max_attempts'?)",
        id="dispatch-unknown-key",
    ),
    pytest.param(
        "engine.yaml",
        "protocol: evalbot.serve/1",
        "protocol: openai/1",
        "engine.protocol",
        "expected a protocol evalbot speaks (one of: evalbot.serve/1, llama-server/1, openai-completions/1), "
        "got 'openai/1'",
        id="engine-protocol",
    ),
    pytest.param(
        "engine.yaml",
        "package: engine",
        "package: my-engine",
        "engine.build.package",
        "expected a Python package name, got 'my-engine'",
        id="engine-package",
    ),
    pytest.param(
        "engine.yaml",
        '"--max-seq", "{max_seq}"',
        '"--max-seq", "{max_tokens}"',
        "engine.serve.argv[5]",
        "unknown placeholder {max_tokens}; expected only: {python}, {tree}, {max_seq}, {device}, {warmup}",
        id="engine-argv-placeholder",
    ),
    pytest.param(
        "engine.yaml",
        'model_file: ["--model", "{model}"]',
        'model_file: ["--model", "model.gguf"]',
        "engine.serve.model_file",
        "expected the placeholder {model}",
        id="engine-model-file",
    ),
    pytest.param(
        "engine.yaml",
        "--ctx {ctx} --runs {runs}",
        "--runs {runs}",
        "engine.contributor.bench",
        "expected the placeholder {ctx}",
        id="engine-bench-ctx",
    ),
    pytest.param(
        "gates.yaml",
        "  confidence: 0.95",
        "  confidence: 95",
        "gates.decode_audit.confidence",
        "expected a number in [0.5, 0.99], got 95",
        id="audit-confidence",
    ),
    pytest.param(
        "gates.yaml",
        "  max_gap: 3.0",
        "  max_gap: 0.5",
        "gates.decode_audit.max_gap",
        "expected a number >= 1, got 0.5",
        id="audit-max-gap-below-near-tie",
    ),
]


# Errors about a whole mapping point at its first key; a duplicate key's error at the second one.
MALFORMED_AT = {
    "area-weights": "  area:kernels:",
    "duplicate-key": "  block: 8",
    "shape-as-spec-draft": "    shape:",
}


@pytest.mark.parametrize("name, old, new, field, message", MALFORMED)
def test_malformed_value_names_file_line_and_field(rules_dir, request, name, old, new, field, message):
    line = edit(rules_dir, name, old, new)
    at = MALFORMED_AT.get(request.node.callspec.id)
    if at is not None:
        lines = (rules_dir / name).read_text().splitlines()
        line = next(i for i, text in enumerate(lines, 1) if text.startswith(at))
    err = load_error(rules_dir)
    assert Path(err.file) == rules_dir / name
    assert (err.line, err.field) == (line, field)
    assert message in err.message
    assert str(err).startswith(f"{rules_dir / name}:{line}: {field}: ")


def test_the_audits_confidence_is_optional_and_defaults(rules_dir):
    edit(
        rules_dir,
        "gates.yaml",
        "  confidence: 0.95      # at most 0.99: a wider interval only lets more through\n",
        "",
    )
    assert load_rules(rules_dir).gates.decode_audit.confidence == 0.95
    edit(rules_dir, "gates.yaml", "  self_drop_max: 0.05", "  self_drop_max: 0.05\n  confidence: 0.99")
    assert load_rules(rules_dir).gates.decode_audit.confidence == 0.99


def test_dispatch_run_settings_are_optional_and_default(rules_dir):
    # Rules written before the actions settings existed still load, with the shipped values as defaults.
    (rules_dir / "dispatch.yaml").write_text("mode: local\nrunner_public_keys: []\n")
    d = load_rules(rules_dir).dispatch
    assert (d.workflow, d.ref, d.timeout_minutes, d.max_attempts) == ("evalbot-eval.yml", "main", 120, 3)
    (rules_dir / "dispatch.yaml").write_text(
        "mode: local\nrunner_public_keys: []\nworkflow: eval.yaml\nref: release/v2\nmax_attempts: 1\n"
    )
    d = load_rules(rules_dir).dispatch
    assert (d.workflow, d.ref, d.timeout_minutes, d.max_attempts) == ("eval.yaml", "release/v2", 120, 1)


def test_missing_key_points_at_its_mapping(rules_dir):
    edit(rules_dir, "gates.yaml", "  mean_kl_max: 0.10   # mean KL(llama.cpp || ours), nats\n", "")
    line = edit(rules_dir, "gates.yaml", "  top1_min: 0.90", "  top1_min: 0.90")
    err = load_error(rules_dir)
    assert (Path(err.file).name, err.line, err.field) == ("gates.yaml", line, "gates.accuracy.mean_kl_max")
    assert err.message.startswith("missing; this mapping needs: top1_min, mean_kl_max")


def test_yaml_syntax_error_reports_yamls_own_line(rules_dir):
    line = edit(rules_dir, "copycat.yaml", "  limit: 3", "  limit: [3")
    err = load_error(rules_dir)
    assert (Path(err.file).name, err.field) == ("copycat.yaml", "copycat")
    assert err.line is not None and err.line >= line  # the flow list is only found unclosed later
    assert err.message.startswith("invalid YAML at column")

    shutil.copy(default_rules_dir() / "copycat.yaml", rules_dir / "copycat.yaml")
    line = edit(rules_dir, "copycat.yaml", "warnings_to_block: 3", "warnings_to_block: 3: 4")
    err = load_error(rules_dir)
    assert (err.line, err.field) == (line, "copycat")
    assert "mapping values are not allowed here" in err.message


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("", 1, "empty file; expected a mapping"),
        ("# only a comment\n", 1, "empty file; expected a mapping"),
        ("\n\n- 0.02\n- 0.035\n", 3, "expected a mapping, got a list"),
        ("just text\n", 1, "expected a mapping, got 'just text'"),
    ],
    ids=["empty", "comment-only", "top-level-list", "top-level-scalar"],
)
def test_empty_or_non_mapping_file(rules_dir, text, line, message):
    (rules_dir / "tiers.yaml").write_text(text)
    err = load_error(rules_dir)
    assert (Path(err.file).name, err.line, err.field, err.message) == ("tiers.yaml", line, "tiers", message)


def test_missing_and_unknown_files(rules_dir):
    (rules_dir / "models.yaml").unlink()
    err = load_error(rules_dir)
    assert (Path(err.file).name, err.line, err.message) == (
        "models.yaml",
        None,
        "missing required rules file",
    )
    assert str(err) == f"{rules_dir / 'models.yaml'}: missing required rules file"

    shutil.copy(default_rules_dir() / "models.yaml", rules_dir / "models.yaml")
    (rules_dir / "model.yaml").write_text("{}\n")
    err = load_error(rules_dir)
    assert Path(err.file).name == "model.yaml"
    assert "unknown rules file (did you mean 'models.yaml'?)" in err.message

    with pytest.raises(RulesError, match="expected a directory"):
        load_rules(rules_dir / "nowhere")


def test_error_survives_pickling():
    err = RulesError(
        "rules/gates.yaml", 12, "gates.accuracy.top1_min", "expected a number in [0, 1], got 'high'"
    )
    assert str(err) == "rules/gates.yaml:12: gates.accuracy.top1_min: expected a number in [0, 1], got 'high'"
    back = pickle.loads(pickle.dumps(err))
    assert (back.file, back.line, back.field, back.message, str(back)) == (
        err.file,
        err.line,
        err.field,
        err.message,
        str(err),
    )


def test_every_shipped_file_is_known():
    assert sorted(p.name for p in default_rules_dir().glob("*.yaml")) == sorted(FILES + OPTIONAL_FILES)


# ---------------------------------------------------------------- pure helpers


# A tier's floor is given + 1e-12: the estimate holds the ratio 1 + gain, whose gain can round below it.
@pytest.mark.parametrize(
    "gain, tier",
    [
        (-0.5, None),
        (0.0, None),
        (0.0199, None),
        (0.02 + 1e-12, "XS"),
        (0.0349, "XS"),
        (0.035 + 1e-12, "S"),
        (0.0599, "S"),
        (0.06 + 1e-12, "M"),
        (0.1, "L"),
        (0.1799, "L"),
        (0.18 + 1e-12, "XL"),
        (3.0, "XL"),
    ],
)
def test_tier_for_gain_boundaries(rules, gain, tier):
    assert tier_for_ci_low(rules, 1 + gain) == tier


@given(st.floats(-0.99, 1), st.floats(-0.99, 1))
def test_tier_for_gain_is_monotone(rules, a, b):
    order = [None, *(t.name for t in rules.tiers)]
    lo, hi = sorted((a, b))
    assert order.index(tier_for_ci_low(rules, 1 + lo)) <= order.index(tier_for_ci_low(rules, 1 + hi))


@pytest.mark.parametrize(
    "enabled, env, allowed",
    [
        (False, {}, False),
        (False, {"EVALBOT_AUTOMERGE": "1"}, False),
        (True, {}, False),
        (True, {"EVALBOT_AUTOMERGE": "0"}, False),
        (True, {"EVALBOT_AUTOMERGE": "true"}, False),
        (True, {"EVALBOT_AUTOMERGE": ""}, False),
        (True, {"EVALBOT_AUTOMERGE": "1"}, True),
    ],
)
def test_automerge_needs_rules_and_env(rules, enabled, env, allowed):
    r = replace(rules, automerge=replace(rules.automerge, enabled=enabled))
    assert automerge_allowed(r, env) is allowed


def test_label_families_are_declared_once_and_never_overlap_where_two_producers_would_fight():
    """Each producer sets only its family as a set difference: two families that share a label would undo
    each other's work every poll. PROTECTED holds what no poll takes off; CLEARED what `clear` does."""
    from evalbot.rules import LabelFamily

    rules = load_rules(default_rules_dir())
    fam = {f: rules.owned(f) for f in LabelFamily}
    setters = (
        LabelFamily.VERDICT,
        LabelFamily.ROUND,
        LabelFamily.INTAKE,
        LabelFamily.SCREEN,
        LabelFamily.CLAIM,
    )
    for i, a in enumerate(setters):
        for b in setters[i + 1 :]:
            assert not fam[a] & fam[b], (a, b, fam[a] & fam[b])
    assert (
        fam[LabelFamily.SCREEN] <= fam[LabelFamily.PROTECTED]
        and rules.labels.hold in fam[LabelFamily.PROTECTED]
    )
    assert fam[LabelFamily.CLEARED] - fam[LabelFamily.PROTECTED] == {rules.labels.exhausted}
    assert {t.label for t in rules.tiers} <= fam[LabelFamily.VERDICT]


def test_a_profile_may_set_each_engines_threads_and_a_bad_count_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("cpu").measurement.threads == 1  # shipped: one each on the 2-core box
    assert rules.profile("gpu").measurement.threads is None  # absent: every core evaluate may use
    edit(rules_dir, "profiles.yaml", "    threads: 1\n", "    threads: 2\n")
    assert load_rules(rules_dir).profile("cpu").measurement.threads == 2
    line = edit(rules_dir, "profiles.yaml", "    threads: 2\n", "    threads: 0\n")
    err = load_error(rules_dir)
    assert err.line == line and "threads" in err.field


def test_a_profile_chooses_how_timed_tokens_come_back_and_a_bad_mode_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.stream == "ends"  # shipped: no per-token sync on the GPU
    assert rules.profile("cpu").measurement.stream == "token"  # absent: a line per token
    line = edit(rules_dir, "profiles.yaml", "    stream: ends\n", "    stream: chunks\n")
    err = load_error(rules_dir)
    assert err.line == line and "stream" in err.field and "token" in str(err) and "ends" in str(err)


def test_a_profile_warms_each_block_off_the_clock_and_a_negative_count_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.warm_requests == 1  # shipped: compile the timed shapes first
    assert rules.profile("cpu").measurement.warm_requests == 0  # absent: none
    line = edit(rules_dir, "profiles.yaml", "    warm_requests: 1\n", "    warm_requests: -1\n")
    err = load_error(rules_dir)
    assert err.line == line and "warm_requests" in err.field


def test_the_engines_threads_follow_the_profile_else_this_process_cpus(tmp_path):
    from evalbot.evaluate.context import RunContext, Workspace, sandbox_spec, usable_cores
    from evalbot.model import EvalRequest

    rules = load_rules(default_rules_dir())
    req = EvalRequest("a" * 40, "b" * 40, "b" * 40, rules.rules_hash, rules.profile("cpu"))
    ctx = RunContext(req, Workspace(tmp_path, tmp_path, rules), lambda _m: None, tmp_path)
    assert sandbox_spec(ctx, tmp_path, tmp_path / "s", [], 60).env["OMP_NUM_THREADS"] == str(usable_cores())
    ctx.engine_threads = 1
    assert sandbox_spec(ctx, tmp_path, tmp_path / "s", [], 60).env["OMP_NUM_THREADS"] == "1"


def test_a_profile_may_slice_its_pairs_and_a_bad_slice_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.slice_s is None  # absent: whole requests
    assert rules.profile("cpu").measurement.slice_s == 0.25  # shipped: quarter-second turns
    for bad in ("0", "0.01", "-1", "fast", "1000"):
        line = edit(rules_dir, "profiles.yaml", "    slice_s: 0.25\n", f"    slice_s: {bad}\n")
        err = load_error(rules_dir)
        assert err.line == line and "slice_s" in err.field, bad
        edit(rules_dir, "profiles.yaml", f"    slice_s: {bad}\n", "    slice_s: 0.25\n")


def test_a_profile_may_start_its_processes_at_once_and_a_bad_start_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.start == "serial"  # absent: one load, then the other
    assert rules.profile("cpu").measurement.start == "parallel"  # shipped: one engine thread each
    line = edit(rules_dir, "profiles.yaml", "    start: parallel\n", "    start: sometimes\n")
    err = load_error(rules_dir)
    assert err.line == line and "start" in err.field and "parallel" in str(err)


def test_a_profile_may_pin_both_engines_to_one_cpu_but_only_with_threads(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.pin is False  # absent: where the scheduler puts them
    assert rules.profile("cpu").measurement.pin is True  # shipped: one vCPU for both sides
    line = edit(rules_dir, "profiles.yaml", "    pin: true\n", "    pin: 'yes'\n")
    err = load_error(rules_dir)
    assert err.line == line and "pin" in err.field and "true or false" in str(err)
    edit(rules_dir, "profiles.yaml", "    pin: 'yes'\n", "    pin: true\n")
    edit(rules_dir, "profiles.yaml", "    threads: 1\n", "")
    err = load_error(rules_dir)
    assert "pin" in err.field and "needs threads" in str(err)


def test_a_profile_may_time_requests_in_seconds_of_mains_decode_and_a_bad_length_names_its_line(rules_dir):
    rules = load_rules(rules_dir)
    assert rules.profile("gpu").measurement.decode_s is None  # absent: decode_tokens
    m = rules.profile("cpu").measurement
    assert m.decode_s == 4 and m.max_decode_tokens == 256  # shipped: 4 s of main's decode
    for bad in ("0.1", "-1", "soon"):
        line = edit(rules_dir, "profiles.yaml", "    decode_s: 4\n", f"    decode_s: {bad}\n")
        err = load_error(rules_dir)
        assert err.line == line and "decode_s" in err.field, bad
        edit(rules_dir, "profiles.yaml", f"    decode_s: {bad}\n", "    decode_s: 4\n")
    line = edit(
        rules_dir, "profiles.yaml", "    decode_s: 4\n", "    decode_s: 4\n    max_decode_tokens: 8\n"
    )
    err = load_error(rules_dir)
    assert err.line == line + 1 and "max_decode_tokens" in err.field and "decode_tokens (24)" in str(err)


# ---------------------------------------------------------------- where the rules are found


def test_the_rules_are_the_checkouts_found_from_any_folder_inside_it(rules_dir, monkeypatch):
    """An installed evalbot serves any contest: the rules are the rules/ of the checkout it runs in (the
    working directory or a folder above), or of the repository a command is given, never the package's."""
    deep = rules_dir.parent / "src" / "kernels"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert default_rules_dir() == rules_dir.resolve()
    assert default_rules_dir(rules_dir.parent) == rules_dir.resolve()
    edit(rules_dir, "dispatch.yaml", "profile: cpu", "profile: gpu")
    assert load_rules(default_rules_dir()).dispatch.profile == "gpu"  # this checkout's, not the shipped


def test_without_a_checkout_the_error_says_where_it_looked_and_what_to_do(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # a checkout with no rules: the search ends at its root
    (tmp_path / "rules").mkdir()  # a rules/ without profiles.yaml is not a contest's rules
    monkeypatch.chdir(tmp_path / "rules")
    with pytest.raises(RulesError) as info:
        default_rules_dir()
    assert str(tmp_path.resolve()) in str(info.value) and "--rules" in str(info.value)


def test_the_engine_is_what_engine_yaml_declares(rules_dir):
    """A contest's own engine: its package, how one serves (argv and model arguments) and its local bench
    command come from engine.yaml; evalbot assumes none of them."""
    from evalbot.policy.template import bench_commands

    (rules_dir / "engine.yaml").write_text(
        "protocol: evalbot.serve/1\n"
        "build: {package: qwen_cuda}\n"
        "serve:\n"
        '  argv: ["{python}", "-m", "qwen_cuda.server", "--ctx-size", "{max_seq}", "--backend", "{device}"]\n'
        '  model_file: ["-m", "{model}"]\n'
        '  random_weights: ["--dummy-weights={shape}"]\n'
        "contributor: {bench: \"make bench ARGS='{model_args}' CTX={ctx}\"}\n"
    )
    e = load_rules(rules_dir).engine
    assert e.package == "qwen_cuda"
    argv = e.serve_argv(e.model_args(model="/m/q.gguf"), python="/v/bin/python", max_seq="4200", device="cuda",
                        warmup="2")  # fmt: skip
    assert argv == ["/v/bin/python", "-m", "qwen_cuda.server", "--ctx-size", "4200", "--backend", "cuda",
                    "-m", "/m/q.gguf"]  # fmt: skip
    assert e.model_args(shape="qwen3-8b") == ["--dummy-weights=qwen3-8b"]
    rules = load_rules(rules_dir)
    cmds = bench_commands(rules)
    assert cmds and all(c.startswith("make bench ARGS='") and "engine" not in c for c in cmds), cmds
    assert (
        load_rules(rules_dir).rules_hash != load_rules(default_rules_dir()).rules_hash
    )  # the engine is in the hash


def test_no_module_of_evalbot_starts_this_repositorys_engine_by_name():
    """The serving process, the build's smoke import and the bench command come from engine.yaml: no
    module of evalbot spells `-m engine` for them, nor for the reference tools (evalbot's own, #38)."""
    import re as _re

    root = Path(__file__).resolve().parents[2] / "evalbot"
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        if _re.search(
            r"[\"']-m[\"'],\s*[\"']engine[\"']|python -m engine\b|import_name: str = [\"']engine", text
        ):
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_a_model_file_on_the_runner_is_named_by_its_absolute_path_and_pinned(rules_dir):
    """#38 part 3: a contest names its own GGUF on the runner's disk, pinned by its sha256."""
    sha = "ab" * 32
    text = (rules_dir / "models.yaml").read_text()
    old = "    - shape: qwen3-1.7b\n"
    assert text.count(old) == 1
    (rules_dir / "models.yaml").write_text(
        text.replace(old, f"    - {{name: qwen-7b, file: /models/qwen-7b.gguf, sha256: {sha}}}\n")
    )
    gpu = next(p for p in load_rules(rules_dir).profiles if p.name == "gpu")
    (ref,) = [m for m in gpu.models if m.source == "file"]
    assert (ref.name, ref.path, ref.sha256, ref.has_weights) == ("qwen-7b", "/models/qwen-7b.gguf", sha, True)
    for bad, message in (("models/qwen.gguf", "expected an absolute path"), ("/m/../etc/x", "without '..'")):
        (rules_dir / "models.yaml").write_text(
            text.replace(old, f"    - {{name: q, file: {bad}, sha256: {sha}}}\n")
        )
        err = load_error(rules_dir)
        assert err.field.endswith(".file") and message in err.message and err.line is not None
    (rules_dir / "models.yaml").write_text(text.replace(old, "    - {name: q, file: /m/q.gguf}\n"))
    assert "sha256" in str(load_error(rules_dir))


@pytest.mark.parametrize(
    "build, field, message",
    [
        ("{}", "engine.build", "expected a package to install, build commands, or both"),
        ("{package: engine, cmake: [x]}", "engine.build.cmake", "unknown key"),
        ('{commands: [["make", "-j{cores}"]]}', "engine.build.commands[0][1]", "unknown placeholder {cores}"),
        ("{commands: [[]]}", "engine.build.commands[0]", "expected at least one argument"),
        ('{commands: [["make"]], toolchain: [opt/cuda]}', "engine.build.toolchain[0]", "absolute path"),
        (
            '{commands: [["make"]], toolchain: ["/"]}',
            "engine.build.toolchain[0]",
            "absolute path of a toolchain",
        ),
    ],
)
def test_a_bad_build_declaration_names_its_line_and_field(rules_dir, build, field, message):
    line = edit(
        rules_dir,
        "engine.yaml",
        "build:\n  # the built tree is installed",
        f"build: {build}\n  # the built tree is installed",
    )
    text = (rules_dir / "engine.yaml").read_text().replace("\n  package: engine\n", "\n", 1)
    (rules_dir / "engine.yaml").write_text(text.replace("\n  project: engine-dist\n", "\n", 1))
    err = load_error(rules_dir)
    assert err.field == field and message in err.message and err.line is not None and err.line >= line, str(
        err
    )


def test_build_commands_and_a_toolchain_are_declared_and_hashed(rules_dir):
    text = (rules_dir / "engine.yaml").read_text()
    (rules_dir / "engine.yaml").write_text(text.replace(
        "  package: engine\n",
        '  package: engine\n  commands:\n    - ["cmake", "--build", "build", "-j{jobs}"]\n  toolchain: [/opt/cuda]\n',
    ))  # fmt: skip
    e = load_rules(rules_dir).engine
    assert e.commands == (("cmake", "--build", "build", "-j{jobs}"),) and e.toolchain == ("/opt/cuda",)
    assert load_rules(rules_dir).rules_hash != load_rules(default_rules_dir()).rules_hash


def test_the_reference_tools_are_evalbots_unless_engine_yaml_names_mains(rules_dir):
    """#38: evalbot brings the llama.cpp reference, its comparison and the registry's fetcher; a contest whose
    architecture llama.cpp cannot run names main's own (its build package's modules)."""
    assert load_rules(rules_dir).engine.reference == "evalbot"
    text = (rules_dir / "engine.yaml").read_text()
    (rules_dir / "engine.yaml").write_text(text.replace("reference: evalbot\n", ""))
    assert load_rules(rules_dir).engine.reference == "evalbot"  # the default
    (rules_dir / "engine.yaml").write_text(text.replace("reference: evalbot\n", "reference: main\n"))
    assert load_rules(rules_dir).engine.reference == "main"
    (rules_dir / "engine.yaml").write_text(text.replace("reference: evalbot\n", "reference: llama\n"))
    err = str(load_error(rules_dir))
    assert "engine.reference" in err and "one of: evalbot, main" in err and "llama" in err
    # main's tools are its package's modules: an engine built by commands alone has none
    (rules_dir / "engine.yaml").write_text(
        text.replace("reference: evalbot\n", "reference: main\n").replace(
            "  package: engine\n", '  commands: [["make"]]\n'
        )
    )
    err = str(load_error(rules_dir))
    assert "engine.reference" in err and "engine.build.package" in err


def test_mains_own_reference_tools_are_harness_modules(rules_dir):
    """With `reference: main`, main's reference, compare and registry modules are the yardstick: a PR that
    touches or shadows them is skipped, and a built head must import them byte for byte as main does."""
    from evalbot.policy.sensitive_paths import harness_hits

    paths = ["engine/reference.py", "engine/compare/__init__.py", "engine/registry.py", "engine/model.py"]
    assert harness_hits(paths, load_rules(rules_dir)) == ()  # evalbot's reference: engine files like any
    edit(rules_dir, "engine.yaml", "reference: evalbot\n", "reference: main\n")
    rules = load_rules(rules_dir)
    assert {"engine.reference", "engine.compare", "engine.registry"} <= set(rules.harness_modules)
    assert harness_hits(paths, rules) == tuple(paths[:3])


def test_the_engines_python_project_may_live_in_a_folder_of_the_tree(rules_dir):
    """build.project: where the tree's pyproject.toml for the engine lies (this repository's root one is
    evalbot's own, which ships evalbot only); a path that leaves the tree, or one without a package, fails."""
    assert load_rules(rules_dir).engine.project == "engine-dist"
    edit(rules_dir, "engine.yaml", "  project: engine-dist\n", "  project: ./py/engine/\n")
    assert load_rules(rules_dir).engine.project == "py/engine"
    for bad in ("/opt/engine", "../elsewhere", "py/../../x", "/"):
        text = (rules_dir / "engine.yaml").read_text()
        (rules_dir / "engine.yaml").write_text(
            text.replace("  project: ./py/engine/\n", f"  project: {bad}\n")
        )
        err = str(load_error(rules_dir))
        assert "engine.build.project" in err and "relative folder inside the tree" in err, bad
        (rules_dir / "engine.yaml").write_text(text)
    edit(rules_dir, "engine.yaml", "  project: ./py/engine/\n", "")
    assert load_rules(rules_dir).engine.project == "."  # the tree's root
