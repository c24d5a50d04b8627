"""tracks.yaml: the scored tracks, read after every other rules file (a track names profiles, their models
and contexts, the tiers' names for its labels, and, for a drafting model, models.yaml's spec pair and
engine.yaml's draft arguments). Each mistake is a RulesError at its line."""

from __future__ import annotations

from evalbot.rules.reader import _MAX_LABEL, _NAME, _File, _join, _Node
from evalbot.rules.schema import (
    DECODE_TRACK,
    DRAFTERS,
    NO_TIER,
    SPEC_TRACK,
    TRACK_METRICS,
    EngineSpec,
    Profile,
    SpecPair,
    Track,
    TrackModel,
)


def tracks(
    f: _File,
    root: _Node,
    profiles: tuple[Profile, ...],
    spec_pair: SpecPair,
    engine: EngineSpec,
    tier_names: tuple[str, ...],
    label_owners: dict[str, str],
) -> tuple[Track, ...]:
    """Every track of tracks.yaml, validated against the other files (see the module's docstring)."""
    out: list[Track] = []
    owners = dict(label_owners)  # every label a track sets must be new: name -> where it was set
    for name, key_node, node in f.items(root, "tracks"):
        field = _join("tracks", name)
        if not _NAME.fullmatch(name):
            f.fail(key_node, field, f"expected a track name (letters, digits, '.', '_', '-'), got {name!r}")
        present = [k for k, _, _ in f.items(node, field)]
        optional = [k for k in ("drafter", "overall", "runs", "tiers") if k in present]
        m = f.mapping(node, field, ("metric", "models", *optional))
        metric = f.choice(m["metric"], f"{field}.metric", TRACK_METRICS, "a track metric")
        for key, why in (
            ("drafter", "drafts"),
            ("runs", "has runs; a decode track's pairs are the profile's"),
        ):
            if key in m and metric != SPEC_TRACK:
                f.fail(
                    m[key], f"{field}.{key}", f"only a {SPEC_TRACK!r} track {why}; this one scores {metric!r}"
                )
        drafter = "ngram"
        if "drafter" in m:
            drafter = f.choice(m["drafter"], f"{field}.drafter", DRAFTERS, "a drafter")
        overall = f.boolean(m["overall"], f"{field}.overall") if "overall" in m else True
        if metric == DECODE_TRACK and not overall:
            f.fail(m["overall"], f"{field}.overall", "a decode track always counts toward the overall tier (labels.yaml's "
                   "tiers); only a speculative track can be kept apart")  # fmt: skip
        runs = f.integer(m["runs"], f"{field}.runs", minimum=2) if "runs" in m else None
        bounds = _bounds(f, m["tiers"], f"{field}.tiers", tier_names) if "tiers" in m else ()
        models = _models(f, m["models"], f"{field}.models", profiles, owners, tier_names)
        if not models:
            f.fail(m["models"], f"{field}.models", "expected at least one model, got none")
        if metric == SPEC_TRACK:
            _check_spec(f, m["models"], field, models, spec_pair, engine, drafter)
        out.append(Track(name, metric, tuple(models), drafter, overall, runs=runs, tiers=bounds))
    if not out:
        f.fail(root, "tracks", "expected at least one track, got none")
    if not any(t.overall for t in out):
        f.fail(root, "tracks", "expected a track with overall: true: the overall tier label comes from those")
    return tuple(out)


def _bounds(f: _File, node: _Node, field: str, tier_names: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """A track's own lower bound for each of tiers.yaml's tiers, rising strictly in tiers.yaml's order."""
    m = f.mapping(node, field, tier_names)
    out: list[tuple[str, float]] = []
    for name in tier_names:
        bound = f.number(m[name], _join(field, name), 0, 1, lo_open=True)
        if out and bound <= out[-1][1]:
            prev, prev_bound = out[-1]
            f.fail(m[name], _join(field, name), f"expected a bound above {prev}'s {prev_bound:g} (tiers rise "
                   f"strictly, in tiers.yaml's order), got {bound:g}")  # fmt: skip
        out.append((name, bound))
    return tuple(out)


def _models(
    f: _File,
    node: _Node,
    field: str,
    profiles: tuple[Profile, ...],
    owners: dict[str, str],
    tier_names: tuple[str, ...],
) -> list[TrackModel]:
    by_name = {p.name: p for p in profiles}
    out = []
    for profile_name, key_node, per_profile in f.items(node, field):
        pfield = _join(field, profile_name)
        profile = by_name.get(profile_name)
        if profile is None:
            f.fail(
                key_node,
                pfield,
                f"expected a profile of profiles.yaml (one of: {', '.join(by_name)}), got {profile_name!r}",
            )
        known = [m.name for m in profile.models]
        ctxs = [c.ctx for c in profile.contexts]
        for model, model_key, entry in f.items(per_profile, pfield):
            mfield = _join(pfield, model)
            if model not in known:
                f.fail(model_key, mfield, f"expected a model of models.yaml's {profile_name!r} profile "
                       f"(one of: {', '.join(known)}), got {model!r}")  # fmt: skip
            if entry.value == "guard":  # a scalar; a mapping's value is its list of pairs
                out.append(TrackModel(profile_name, model, ()))
                continue
            given = [k for k, _, _ in f.items(entry, mfield)]
            m = f.mapping(entry, mfield, ("scored", *(("label",) if "label" in given else ())))
            scored = []
            for i, item in enumerate(f.sequence(m["scored"], f"{mfield}.scored")):
                ctx = f.integer(item, f"{mfield}.scored[{i}]")
                if ctx not in ctxs:
                    f.fail(item, f"{mfield}.scored[{i}]", f"expected a context of profile {profile_name!r} "
                           f"(one of: {', '.join(map(str, ctxs))}), got {ctx}")  # fmt: skip
                if not next(c.guarded for c in profile.contexts if c.ctx == ctx):
                    f.fail(item, f"{mfield}.scored[{i}]", f"ctx {ctx} is not guarded in profiles.yaml: a context "
                           "that can earn a tier must also be able to fail one")  # fmt: skip
                if ctx in scored:
                    f.fail(item, f"{mfield}.scored[{i}]", f"expected each context once, got {ctx} again")
                scored.append(ctx)
            if not scored:
                f.fail(m["scored"], f"{mfield}.scored", "expected at least one context (a model scored nowhere is "
                       "written `guard`)")  # fmt: skip
            if "label" not in m:
                out.append(TrackModel(profile_name, model, tuple(scored)))
                continue
            prefix = f.label(m["label"], f"{mfield}.label")
            for tier in (*tier_names, NO_TIER):
                label = f"{prefix}:{tier}"
                if len(label) > _MAX_LABEL:
                    f.fail(m["label"], f"{mfield}.label", f"{label!r} is longer than GitHub's {_MAX_LABEL} characters "
                           "for a label: shorten the prefix")  # fmt: skip
                if label in owners:
                    f.fail(m["label"], f"{mfield}.label", f"expected labels not used elsewhere; {label!r} is "
                           f"already {owners[label]}")  # fmt: skip
                owners[label] = f"{mfield}.label"
            out.append(TrackModel(profile_name, model, tuple(scored), prefix))
    return out


def _check_spec(
    f: _File,
    node: _Node,
    field: str,
    models: list[TrackModel],
    pair: SpecPair,
    engine: EngineSpec,
    drafter: str,
) -> None:
    """Drafting with a model means the spec pair's target (a model of the track's profile) drafted by the
    pair's draft, which the target's serving engine must load (engine.yaml serve.draft)."""
    for e in models:
        if drafter == "draft" and e.model != pair.target.name:
            f.fail(node, f"{field}.models.{e.profile}.{e.model}", f"drafter 'draft' drafts for models.yaml's "
                   f"spec target {pair.target.name!r} only, not {e.model!r}")  # fmt: skip
    if drafter == "draft" and not engine.draft_args:
        f.fail(node, f"{field}.drafter", "drafter 'draft' needs engine.yaml's serve.draft (how the engine is "
               "given its draft model, e.g. [\"--draft\", \"{draft}\"])")  # fmt: skip


__all__ = ["tracks"]
