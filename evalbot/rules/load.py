"""``load_rules``: each rules file read by one function, in an order where a file refers only to the ones
before it, into the dataclasses of ``evalbot.rules.schema``. The functions for the measurement files (tiers,
labels, gates, profiles, models) are here; those for copycat, policy, automerge and dispatch are in
``evalbot.rules.sections``."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from evalbot.rules.reader import (
    _NAME,
    _compose,
    _did_you_mean,
    _File,
    _join,
)
from evalbot.rules.schema import (
    DEVICES,
    FILES,
    OPENAI_PROTOCOL,
    OPTIONAL_FILES,
    STARTS,
    STREAMS,
    AccuracyGate,
    Context,
    DecodeAuditGate,
    Gates,
    Labels,
    Measurement,
    ModelRef,
    NoRegressionGate,
    Profile,
    Quiet,
    Rules,
    RulesError,
    SpecGate,
    SpecPair,
    Tier,
    TimingGate,
    Track,
    rules_hash,
)
from evalbot.rules.sections import _automerge, _copycat, _dispatch, _engine, _policy
from evalbot.rules.tracks_load import tracks as _tracks


def load_rules(directory: str | Path) -> Rules:
    """Read and validate every rules file in the directory; RulesError on the first problem."""
    root = Path(directory)
    if not root.is_dir():
        raise RulesError(str(root), None, "", "expected a directory of rules files")
    present = sorted(p.name for p in root.iterdir() if p.suffix in (".yaml", ".yml"))
    for name in present:
        if name not in FILES + OPTIONAL_FILES:
            hint = _did_you_mean(name, FILES + OPTIONAL_FILES)
            raise RulesError(
                str(root / name),
                None,
                "",
                f"unknown rules file{hint}; expected only: {', '.join(FILES + OPTIONAL_FILES)}",
            )
    for name in FILES:
        if name not in present:
            raise RulesError(str(root / name), None, "", "missing required rules file")

    docs = {name.removesuffix(".yaml"): _compose(root / name) for name in FILES}
    tier_bounds = _tiers(*docs["tiers"])
    tiers, labels = _labels(*docs["labels"], tier_bounds)
    gates = _gates(*docs["gates"])
    profiles, spec_pair = _models(*docs["models"], _profiles(*docs["profiles"]))
    copycat = _copycat(*docs["copycat"])
    policy = _policy(*docs["policy"], _label_owners(tiers, labels))
    known = _label_owners(tiers, labels) | {a.label: f"policy.areas.{a.label}" for a in policy.areas}
    automerge = _automerge(*docs["automerge"], tiers, known)
    dispatch = _dispatch(*docs["dispatch"], [p.name for p in profiles])
    engine = _engine(*docs["engine"])
    shapes = sorted({m.name for p in profiles for m in p.models if m.source == "shape"})
    if shapes and not engine.random_weights:
        raise RulesError(
            str(root / "models.yaml"),
            None,
            "models",
            f"the shape(s) {', '.join(shapes)} need random weights, and engine.yaml's engine serves none "
            "(no serve.random_weights): name a model file instead",
        )
    if shapes and engine.protocol == OPENAI_PROTOCOL:
        raise RulesError(
            str(root / "models.yaml"),
            None,
            "models",
            f"the shape(s) {', '.join(shapes)} have no model file, and an {OPENAI_PROTOCOL} engine's vocabulary "
            "(which its API does not give) is read from one: name a model file instead",
        )
    tracks: tuple[Track, ...] = ()
    if "tracks.yaml" in present:
        tracks = _tracks(*_compose(root / "tracks.yaml"), profiles, spec_pair, engine,
                         tuple(t.name for t in tiers), known)  # fmt: skip
    rules = Rules(
        tiers,
        gates,
        profiles,
        spec_pair,
        copycat,
        policy,
        labels,
        automerge,
        dispatch,
        engine,
        root,
        "",
        tracks,
    )
    return replace(rules, rules_hash=rules_hash(rules))


def _tiers(f: _File, root: yaml.Node) -> list[tuple[str, float]]:
    node = f.mapping(root, "tiers", ("lower_bounds",))["lower_bounds"]
    out: list[tuple[str, float]] = []
    for name, key_node, value_node in f.items(node, "tiers.lower_bounds"):
        field = _join("tiers.lower_bounds", name)
        if not _NAME.fullmatch(name):
            f.fail(key_node, field, f"expected a tier name (letters, digits, '.', '_', '-'), got {name!r}")
        # A tier at 0 would label PRs that gained nothing.
        bound = f.number(value_node, field, 0, 1, lo_open=True)
        if out and bound <= out[-1][1]:
            prev, prev_bound = out[-1]
            f.fail(
                value_node,
                field,
                f"expected a bound above {prev}'s {prev_bound:g} (tiers rise strictly), got {bound:g}",
            )
        out.append((name, bound))
    if not out:
        f.fail(node, "tiers.lower_bounds", "expected at least one tier, got none")
    return out


def _labels(
    f: _File, root: yaml.Node, tier_bounds: list[tuple[str, float]]
) -> tuple[tuple[Tier, ...], Labels]:
    status_keys = [fl.name for fl in fields(Labels)]
    given = {key for key, _, _ in f.items(root, "labels")}
    status_keys = [k for k in status_keys if k not in _OPTIONAL_LABELS or k in given]
    m = f.mapping(root, "labels", ["tiers", *status_keys])
    tier_names = [name for name, _ in tier_bounds]
    tier_nodes = f.mapping(m["tiers"], "labels.tiers", tier_names)
    owner: dict[str, str] = {}

    def unique(node: yaml.Node, field: str) -> str:
        name = f.label(node, field)
        if name in owner:
            f.fail(node, field, f"expected a label not used elsewhere, got {name!r} (already {owner[name]})")
        owner[name] = field
        return name

    tiers = tuple(Tier(n, b, unique(tier_nodes[n], f"labels.tiers.{n}")) for n, b in tier_bounds)
    labels = Labels(**{key: unique(m[key], f"labels.{key}") for key in status_keys})
    return tiers, labels


_OPTIONAL_LABELS = ("copycat_cleared",)  # absent: the dataclass's default name


def _label_owners(tiers: tuple[Tier, ...], labels: Labels) -> dict[str, str]:
    owners = {t.label: f"labels.tiers.{t.name}" for t in tiers}
    owners.update({getattr(labels, fl.name): f"labels.{fl.name}" for fl in fields(Labels)})
    return owners


def _gates(f: _File, root: yaml.Node) -> Gates:
    present = {key for key, _, _ in f.items(root, "gates")}
    optional = [k for k in ("timing", "decode_audit") if k in present]
    m = f.mapping(root, "gates", ("no_regression", "accuracy", "spec", *optional))
    timing = TimingGate()
    if "timing" in m:
        keys = ("max_self_report_gap", "cpu_clock_tolerance")
        given = {key for key, _, _ in f.items(m["timing"], "gates.timing")}
        tm = f.mapping(m["timing"], "gates.timing", tuple(k for k in keys if k in given or k == keys[0]))
        timing = TimingGate(
            f.fraction(tm["max_self_report_gap"], "gates.timing.max_self_report_gap"),
            f.fraction(tm["cpu_clock_tolerance"], "gates.timing.cpu_clock_tolerance")
            if "cpu_clock_tolerance" in tm
            else TimingGate.cpu_clock_tolerance,
        )
    audit = DecodeAuditGate()
    if "decode_audit" in m:
        audit_keys = ["top1_min", "near_tie", "share", "min_requests", "self_top1_min", "self_drop_max"]
        given = {key for key, _, _ in f.items(m["decode_audit"], "gates.decode_audit")}
        optional_audit = ("confidence", "max_gap", "flip_rate_max")  # absent: the dataclass's defaults
        audit_keys += [k for k in optional_audit if k in given]
        da = f.mapping(m["decode_audit"], "gates.decode_audit", audit_keys)
        near_tie = f.number(da["near_tie"], "gates.decode_audit.near_tie", 0, None)
        audit = DecodeAuditGate(
            top1_min=f.fraction(da["top1_min"], "gates.decode_audit.top1_min"),
            near_tie=near_tie,
            share=f.ratio(da["share"], "gates.decode_audit.share"),
            min_requests=f.integer(da["min_requests"], "gates.decode_audit.min_requests"),
            self_top1_min=f.fraction(da["self_top1_min"], "gates.decode_audit.self_top1_min"),
            self_drop_max=f.fraction(da["self_drop_max"], "gates.decode_audit.self_drop_max"),
            # a higher confidence widens the interval, and a share fails only where the interval is below the
            # bar: past 0.99 it would only let more through
            confidence=f.number(da["confidence"], "gates.decode_audit.confidence", 0.5, 0.99)
            if "confidence" in da
            else DecodeAuditGate.confidence,
            # at least near_tie: a gap past max_gap fails at once, one up to it is a rare flip
            max_gap=f.number(da["max_gap"], "gates.decode_audit.max_gap", near_tie, None)
            if "max_gap" in da
            else None,
            flip_rate_max=f.number(da["flip_rate_max"], "gates.decode_audit.flip_rate_max", 0, 0.05)
            if "flip_rate_max" in da
            else DecodeAuditGate.flip_rate_max,
        )
    nr = f.mapping(m["no_regression"], "gates.no_regression", ("min_ratio",))
    acc = f.mapping(m["accuracy"], "gates.accuracy", ("top1_min", "mean_kl_max"))
    sp_keys = ("runs", "lossless_runs_min", "tau_min_ratio", "ar_speed_min_ratio")
    sp = f.mapping(m["spec"], "gates.spec", sp_keys)
    runs = f.integer(sp["runs"], "gates.spec.runs")
    lossless = f.integer(sp["lossless_runs_min"], "gates.spec.lossless_runs_min")
    if lossless > runs:
        f.fail(
            sp["lossless_runs_min"],
            "gates.spec.lossless_runs_min",
            f"expected at most runs ({runs}), got {lossless}",
        )
    return Gates(
        no_regression=NoRegressionGate(f.ratio(nr["min_ratio"], "gates.no_regression.min_ratio")),
        accuracy=AccuracyGate(
            top1_min=f.fraction(acc["top1_min"], "gates.accuracy.top1_min"),
            mean_kl_max=f.number(acc["mean_kl_max"], "gates.accuracy.mean_kl_max", 0, None),
        ),
        spec=SpecGate(
            runs=runs,
            lossless_runs_min=lossless,
            tau_min_ratio=f.ratio(sp["tau_min_ratio"], "gates.spec.tau_min_ratio"),
            ar_speed_min_ratio=f.ratio(sp["ar_speed_min_ratio"], "gates.spec.ar_speed_min_ratio"),
        ),
        timing=timing,
        decode_audit=audit,
    )


def _profiles(f: _File, root: yaml.Node) -> list[Profile]:
    out = []
    for name, key_node, node in f.items(root, "profiles"):
        field = _join("profiles", name)
        if not _NAME.fullmatch(name):
            f.fail(key_node, field, f"expected a profile name (letters, digits, '.', '_', '-'), got {name!r}")
        present = {key for key, _, _ in f.items(node, field)}
        m = f.mapping(
            node, field, ("device", "contexts", "measurement", *(("quiet",) if "quiet" in present else ()))
        )
        out.append(
            Profile(
                name=name,
                device=f.choice(m["device"], f"{field}.device", DEVICES, "a device"),
                contexts=_contexts(f, m["contexts"], f"{field}.contexts"),
                measurement=_measurement(f, m["measurement"], f"{field}.measurement"),
                models=(),
                quiet=_quiet(f, m["quiet"], f"{field}.quiet") if "quiet" in m else Quiet(),
            )
        )
    if not out:
        f.fail(root, "profiles", "expected at least one profile, got none")
    return out


def _contexts(f: _File, node: yaml.Node, field: str) -> tuple[Context, ...]:
    first_line: dict[int, int] = {}
    out = []
    for i, item in enumerate(f.sequence(node, field)):
        m = f.mapping(item, _join(field, i), ("ctx", "guarded", "scored"))
        ctx = f.integer(m["ctx"], f"{field}[{i}].ctx")
        if ctx in first_line:
            f.fail(
                m["ctx"],
                f"{field}[{i}].ctx",
                f"expected each context once, got {ctx} again (first on line {first_line[ctx]})",
            )
        first_line[ctx] = m["ctx"].start_mark.line + 1
        out.append(
            Context(
                ctx,
                f.boolean(m["guarded"], f"{field}[{i}].guarded"),
                f.boolean(m["scored"], f"{field}[{i}].scored"),
            )
        )
    if not any(c.scored for c in out):
        # With nothing scored no PR could ever earn a tier.
        f.fail(node, field, "expected at least one context with scored: true, got none")
    return tuple(out)


def _quiet(f: _File, node: yaml.Node, field: str) -> Quiet:
    m = f.mapping(node, field, [fl.name for fl in fields(Quiet)])
    return Quiet(
        max_other_cores=f.number(m["max_other_cores"], f"{field}.max_other_cores", 0, None, lo_open=True),
        max_gpu_util=f.number(m["max_gpu_util"], f"{field}.max_gpu_util", 0, 100),
        sample_s=f.number(m["sample_s"], f"{field}.sample_s", 0, 60, lo_open=True),
        max_wait_s=f.number(m["max_wait_s"], f"{field}.max_wait_s", 0, 86400),
    )


_OPTIONAL_MEASUREMENT = (
    "run_timeout_s",
    "max_output_mb",
    "pairs_per_block",
    "min_blocks",
    "threads",
    "max_decode_tokens",
)
_OPTIONAL_TEXT = ("stream", "start", "pin")
_OPTIONAL_COUNTS = ("warm_requests",)  # may be 0
_OPTIONAL_SECONDS = ("slice_s", "decode_s")


def _measurement(f: _File, node: yaml.Node, field: str) -> Measurement:
    keys = [fl.name for fl in fields(Measurement)]
    present = {key for key, _, _ in f.items(node, field)}
    optional_keys = _OPTIONAL_MEASUREMENT + _OPTIONAL_TEXT + _OPTIONAL_COUNTS + _OPTIONAL_SECONDS
    m = f.mapping(node, field, [k for k in keys if k not in optional_keys or k in present])
    optional: dict[str, Any] = {
        k: f.integer(m[k], f"{field}.{k}", minimum=1) for k in _OPTIONAL_MEASUREMENT if k in m
    }
    for k in _OPTIONAL_COUNTS:
        if k in m:
            optional[k] = f.integer(m[k], f"{field}.{k}", minimum=0)
    if "slice_s" in m:  # a slice must hold a few decode steps, and a signal's latency must not matter
        optional["slice_s"] = f.number(m["slice_s"], f"{field}.slice_s", 0.05, 60)
    if "decode_s" in m:  # a request of a second at least: a few steps of the slowest engine
        optional["decode_s"] = f.number(m["decode_s"], f"{field}.decode_s", 0.5, 600)
    if "stream" in m:
        optional["stream"] = f.choice(m["stream"], f"{field}.stream", STREAMS, "a stream mode")
    if "start" in m:
        optional["start"] = f.choice(m["start"], f"{field}.start", STARTS, "a start mode")
    if "pin" in m:
        optional["pin"] = f.boolean(m["pin"], f"{field}.pin")
        if optional["pin"] and "threads" not in optional:
            f.fail(
                m["pin"], f"{field}.pin", "pinning the engines needs threads: the CPUs each engine is given"
            )
    min_pairs = f.integer(m["min_pairs"], f"{field}.min_pairs", minimum=2)  # one pair has no spread
    max_pairs = f.integer(m["max_pairs"], f"{field}.max_pairs", minimum=2)
    if max_pairs < min_pairs:
        f.fail(
            m["max_pairs"],
            f"{field}.max_pairs",
            f"expected at least min_pairs ({min_pairs}), got {max_pairs}",
        )
    decode_tokens = f.integer(m["decode_tokens"], f"{field}.decode_tokens")
    if optional.get("max_decode_tokens", decode_tokens) < decode_tokens:
        f.fail(
            m["max_decode_tokens"],
            f"{field}.max_decode_tokens",
            f"expected at least decode_tokens ({decode_tokens}), got {optional['max_decode_tokens']}",
        )
    return Measurement(
        decode_tokens=decode_tokens,
        warmup_runs=f.integer(m["warmup_runs"], f"{field}.warmup_runs", minimum=0),
        ci_half_width=f.number(
            m["ci_half_width"], f"{field}.ci_half_width", 0, 1, lo_open=True, hi_open=True
        ),
        min_pairs=min_pairs,
        max_pairs=max_pairs,
        time_budget_s=f.integer(m["time_budget_s"], f"{field}.time_budget_s"),
        **optional,
    )


def _model(f: _File, node: yaml.Node, field: str, registry_only: bool = False) -> ModelRef:
    keys = {key for key, _, _ in f.items(node, field)}
    if registry_only and "shape" in keys:
        # Random weights make a draft and its target disagree almost always: nothing to measure.
        f.fail(
            node, field, "expected a registry model with 'registry' and 'sha256', got a random-weight shape"
        )
    if "file" in keys:  # a model file on the runner, pinned: evalbot checks its digest, nothing fetches it
        m = f.mapping(node, field, ("name", "file", "sha256"))
        path = f.text(m["file"], f"{field}.file", what="an absolute path to the model file on the runner")
        if not path.startswith("/") or "/../" in f"{path}/":
            f.fail(m["file"], f"{field}.file", f"expected an absolute path without '..', got {path!r}")
        return ModelRef(
            f.text(m["name"], f"{field}.name", _NAME, "a model name"),
            "file",
            f.sha256(m["sha256"], f"{field}.sha256"),
            path,
        )
    if "registry" in keys or registry_only:
        m = f.mapping(node, field, ("registry", "sha256"))
        return ModelRef(
            f.text(m["registry"], f"{field}.registry", _NAME, "a model name"),
            "registry",
            f.sha256(m["sha256"], f"{field}.sha256"),
        )
    if "shape" in keys:
        m = f.mapping(node, field, ("shape",))
        return ModelRef(f.text(m["shape"], f"{field}.shape", _NAME, "a shape name"), "shape", None)
    f.fail(node, field, "expected a mapping with 'registry' and 'sha256', with 'name', 'file' and 'sha256', "
           "or with 'shape' alone")  # fmt: skip


def _models(f: _File, root: yaml.Node, profiles: list[Profile]) -> tuple[tuple[Profile, ...], SpecPair]:
    m = f.mapping(root, "models", ("profiles", "spec"))
    names = [p.name for p in profiles]
    per_profile = f.mapping(m["profiles"], "models.profiles", names)
    out = []
    for profile in profiles:
        field = f"models.profiles.{profile.name}"
        refs: list[ModelRef] = []
        for i, item in enumerate(f.sequence(per_profile[profile.name], field)):
            ref = _model(f, item, _join(field, i))
            if any(r.name == ref.name for r in refs):
                f.fail(item, _join(field, i), f"expected each model once, got {ref.name!r} again")
            refs.append(ref)
        if not refs:
            f.fail(per_profile[profile.name], field, "expected at least one model, got none")
        out.append(replace(profile, models=tuple(refs)))
    sp = f.mapping(m["spec"], "models.spec", ("profile", "target", "draft", "block"))
    spec = SpecPair(
        profile=f.choice(sp["profile"], "models.spec.profile", names, "a profile name"),
        target=_model(f, sp["target"], "models.spec.target", registry_only=True),
        draft=_model(f, sp["draft"], "models.spec.draft", registry_only=True),
        block=f.integer(sp["block"], "models.spec.block"),
    )
    return tuple(out), spec


__all__ = ["load_rules"]
