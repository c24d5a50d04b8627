"""The rules as frozen dataclasses, the rules' error, and the helpers every reader of the rules uses
(the login pattern, the rules hash, the auto-merge consent). No YAML here: ``evalbot.rules.load`` reads it."""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

# Parse order: a file may refer only to files before it (labels name tiers, automerge names labels).
FILES = (
    "tiers.yaml",
    "labels.yaml",
    "gates.yaml",
    "profiles.yaml",
    "models.yaml",
    "copycat.yaml",
    "policy.yaml",
    "automerge.yaml",
    "dispatch.yaml",
    "engine.yaml",
)
# Read after FILES when present; absent, the default applies (``Rules.scoring``): one decode track, every
# model of every profile scored at the profile's scored contexts, no label per model.
OPTIONAL_FILES = ("tracks.yaml",)


AUTOMERGE_ENV = "EVALBOT_AUTOMERGE"


DISPATCH_MODES = ("local", "actions")


DEVICES = ("cuda", "cpu")


# the one pattern a GitHub login must match, wherever one is accepted (rules, the CLI, the ledgers, the
# store): letters, digits and hyphens, at most 39, not starting with a hyphen; an app's "name[bot]" too
LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")


_LOGIN = LOGIN


def is_login(text: object) -> bool:
    """Whether text is a well-formed GitHub login (LOGIN, matched whole)."""
    return isinstance(text, str) and LOGIN.fullmatch(text) is not None


class RulesError(ValueError):
    """A rules file is missing, unknown or invalid; str() is ``file:line: field: message``."""

    def __init__(self, file: str, line: int | None, field: str, message: str) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    # ValueError would pickle only the formatted text and fail to rebuild from it.
    def __reduce__(self) -> tuple[Any, ...]:
        return (RulesError, (self.file, self.line, self.field, self.message))


@dataclass(frozen=True)
class Tier:
    """A tier: the lowest lower-bound gain (a fraction, 0.02 is +2%) that earns it, and its label."""

    name: str
    lower_bound: float
    label: str


@dataclass(frozen=True)
class NoRegressionGate:
    min_ratio: float  # head/main throughput at every guarded context


@dataclass(frozen=True)
class AccuracyGate:
    top1_min: float  # top-1 agreement with llama.cpp on the same GGUF
    mean_kl_max: float


@dataclass(frozen=True)
class SpecGate:
    runs: int
    lossless_runs_min: int
    tau_min_ratio: float  # mean accepted tokens per verify step, head/main
    ar_speed_min_ratio: float


@dataclass(frozen=True)
class TimingGate:
    # The harness times every token itself; an engine's own timings are diagnostics. When they differ
    # from the harness's clock by more than this share, the report says so (it decides nothing).
    max_self_report_gap: float = 0.2
    # The decode clock that scores: the CPU time of the engine's process tree (read by the harness; blind to
    # steal and preemption) where the head keeps its CPUs as busy per wall second as main does, i.e. the
    # 95% CI of the head/main utilization ratio (CPU seconds per wall second) lies within 1 +- this;
    # otherwise wall time. Wall time is guarded either way. Sleeping instead of spinning, more threads,
    # work outside the metered tree: each moves the utilization, so each is judged on wall time.
    cpu_clock_tolerance: float = 0.01


@dataclass(frozen=True)
class DecodeAuditGate:
    # The timed tokens, teacher-forced through the reference: this share must be its top-1, and every
    # other one a near-tie (the reference's top two closer than near_tie, in log-probability).
    top1_min: float = 0.95
    near_tie: float = 1.0
    share: float = 0.25  # of each side's timed requests, at every context...
    min_requests: int = 4  # ...and never fewer than this
    # Where main is the reference (random weights): main's own tokens set the bar. The head's share may
    # fall at most self_drop_max below main's, and main below self_top1_min means the harness is off.
    self_top1_min: float = 0.80
    self_drop_max: float = 0.05
    # The head fails on its share only where the interval of this confidence lies wholly below the bar (its
    # share's, and its drop's below main's); an audit that cannot tell is widened to every timed request.
    confidence: float = 0.95
    # A disagreement past near_tie but at most max_gap below the reference's top-1 (a lossy decode's rare
    # flip: the int8 demo's 1.07) fails only where the head has them confidently more often than main; one
    # past max_gap fails at once. None: every disagreement past near_tie fails at once.
    max_gap: float | None = None
    # how much more often than main, as a share of the tokens, the head may flip past a near-tie (up to
    # max_gap) before its interval fails it: int8 weights flipped 1 token in 344 (0.3%)
    flip_rate_max: float = 0.0


@dataclass(frozen=True)
class Gates:
    no_regression: NoRegressionGate
    accuracy: AccuracyGate
    spec: SpecGate
    timing: TimingGate = TimingGate()
    decode_audit: DecodeAuditGate = DecodeAuditGate()


@dataclass(frozen=True)
class Context:
    ctx: int  # prompt tokens before decode
    guarded: bool  # must not regress
    scored: bool  # counts toward the gain and so the tier


@dataclass(frozen=True)
class Measurement:
    decode_tokens: int
    warmup_runs: int
    ci_half_width: float  # adaptive stopping target for the gain's 95% CI
    min_pairs: int
    max_pairs: int
    time_budget_s: int
    run_timeout_s: int = 600  # wall limit of one engine process; past it the run is killed
    max_output_mb: int = 64  # stdout or stderr of one run beyond this stops it
    pairs_per_block: int = 4  # pairs per context in each block of fresh serving processes
    min_blocks: int = 3  # the CI treats blocks as clusters: at least this many
    threads: int | None = (
        None  # each engine's CPU threads (OMP_NUM_THREADS); None: every core evaluate may use
    )
    # How a timed request's tokens come back: "token" (a line each, as decoded) or "ends" (the first at
    # once, the rest in one line after the last: no per-token write, flush or host sync while timed).
    stream: str = "token"
    # Untimed requests per context and side at the start of every block, each side alone, before the timed
    # pairs: the shapes a timed request takes are compiled off the clock, in both processes alike.
    warm_requests: int = 0
    # A pair's two requests answered in alternating slices of this many seconds of the harness's time (each
    # side frozen while the other runs; frozen time is not the side's), instead of one after the other:
    # the box's slow drift then falls on both alike. None: one request, then the other.
    slice_s: float | None = None
    # How a block's two serving processes start: "serial" (one loads, then the other) or "parallel" (both
    # load at once). On a 2-core VM with one engine thread each, both were ready in 4.7-5.6 s at once against
    # 11-20 s one after the other (docs/benchmarks.md, #26); with every core per engine two loads fight.
    start: str = "serial"
    # Both engines of a block on the same `threads` CPUs once they are ready (the last of those the evaluation
    # may use; the first are left to the harness): on a VM each vCPU has a speed of its own, and two engines the
    # scheduler keeps on different ones differ by it (evaluate/pinning.py). Needs `threads`.
    pin: bool = False
    # A timed request's length in seconds of main's decode instead of a fixed count: at each context, main
    # alone answers one untimed request of `decode_tokens` in the first block, and every timed request there
    # then asks for this many seconds of main's rate (at least `decode_tokens`, at most `max_decode_tokens`),
    # the same count for both sides. A fast engine's pairs then average as much of the box's noise as a slow
    # one's. None: `decode_tokens` a request.
    decode_s: float | None = None
    max_decode_tokens: int = 256


STREAMS = ("token", "ends")
STARTS = ("serial", "parallel")


@dataclass(frozen=True)
class Quiet:
    """When the box counts as quiet (nothing but this evaluation using it), and how long to wait for it."""

    max_other_cores: float = 0.3  # CPU used by other processes, in cores, over one sample
    max_gpu_util: float = 10.0  # % GPU utilization while our engines do not run (gpu profile)
    sample_s: float = 2.0
    max_wait_s: float = 300.0  # past it, INFRA_ERROR "box busy"


@dataclass(frozen=True)
class ModelRef:
    """A model pinned by sha256, from the registry or a file on the runner, or a named shape with random
    weights (sha256 None)."""

    name: str
    source: str  # "registry" | "file" | "shape"
    sha256: str | None
    path: str | None = None  # a file on the runner (source "file"): absolute

    @property
    def has_weights(self) -> bool:
        """A real model file (registry or on the runner): tokenized prompts, the reference, the audit."""
        return self.source in ("registry", "file")


@dataclass(frozen=True)
class Profile:
    """Where and how to measure: device, contexts, measurement settings and the models."""

    name: str
    device: str
    contexts: tuple[Context, ...]
    measurement: Measurement
    models: tuple[ModelRef, ...]
    quiet: Quiet = Quiet()

    @property
    def scored_contexts(self) -> tuple[int, ...]:
        """The context lengths that count toward the gain."""
        return tuple(c.ctx for c in self.contexts if c.scored)


@dataclass(frozen=True)
class SpecPair:
    profile: str
    target: ModelRef
    draft: ModelRef
    block: int


@dataclass(frozen=True)
class Containment:
    block: float
    warn: float  # [warn, block) warns


@dataclass(frozen=True)
class TinyPr:
    below_added_lines: int  # PRs this small are never blocked automatically
    warn_literal_overlap: float


@dataclass(frozen=True)
class Winnowing:
    k: int  # tokens per k-gram
    w: int  # k-grams per window


@dataclass(frozen=True)
class Strikes:
    limit: int
    window_days: int


@dataclass(frozen=True)
class Copycat:
    containment: Containment
    warnings_to_block: int
    tiny_pr: TinyPr
    boilerplate_max_prs: int  # a fingerprint seen in more PRs than this is ignored
    winnowing: Winnowing
    strikes: Strikes


@dataclass(frozen=True)
class Area:
    label: str
    weight: float
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Stale:
    days_without_push: int  # a PR with no push for longer is stale and no longer evaluated
    max_fruitless_verdicts: int  # more REJECT or no-tier verdicts than this and the PR is exhausted


@dataclass(frozen=True)
class Template:
    require_benchmark: bool  # a PR without the contributor's own before/after numbers waits for them
    claim_gap_max: float  # claimed gain above the measured one by more than this (a fraction) is flagged


@dataclass(frozen=True)
class Policy:
    open_pr_cap: int
    areas: tuple[Area, ...]  # first match wins
    sensitive_paths: tuple[str, ...]
    blocklist: tuple[str, ...]
    stale: Stale
    template: Template
    # the harness as Python imports it: a PR adding any file that would be imported as one of these
    # (engine/cli/__init__.py, engine/cli.cpython-311-x86_64-linux-gnu.so, ...) is skipped like a path
    harness_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Labels:
    verified: str
    regression: str
    infra_error: str
    accuracy_fail: str
    spec_fail: str
    copycat: str
    copycat_warn: str
    gaming: str
    needs_rebase: str
    skipped_sensitive: str
    skipped_cap: str
    needs_benchmark: str
    claim_gap: str
    stale: str
    exhausted: str
    merge_first: str
    re_evaluate: str
    inconclusive: str
    hold: str
    # set by `evalbot clear` on a copycat flag it takes off (optional in labels.yaml: this by default)
    copycat_cleared: str = "copycat-cleared"


@dataclass(frozen=True)
class Automerge:
    enabled: bool
    min_tier: str
    required_labels: tuple[str, ...]
    blocking_labels: tuple[str, ...]
    # a successful run of this workflow (this repository's CI) on the measured head, or no auto-merge
    required_ci_workflow: str | None = None
    # a PR that touches these (tests, CI, build files: not benchmark code) also needs approval_label,
    # set by a maintainer, before it merges on a speed verdict
    approval_paths: tuple[str, ...] = ()
    approval_label: str | None = None


@dataclass(frozen=True)
class Dispatch:
    mode: str  # "local" | "actions"
    runner_public_keys: tuple[str, ...]  # Ed25519, base64 of the raw 32 bytes
    # the profile every PR is judged on (policy: the poller and the workflows pass none; `evalbot evaluate
    # --profile` overrides it for one manual run)
    profile: str = "cpu"
    # actions mode: the workflow_dispatch workflow, the trusted ref it runs from, how long one run may take
    # (queued included) before it is abandoned, and how many runs one evaluation may use in all
    workflow: str = "evalbot-eval.yml"
    ref: str = "main"
    timeout_minutes: int = 120
    max_attempts: int = 3


# evalbot.serve/1: JSON lines on stdin and stdout; llama-server/1: llama.cpp's HTTP server on {port}, behind the
# harness's relay (docs/protocol.md)
OPENAI_PROTOCOL = "openai-completions/1"  # OpenAI-compatible completions that return token ids
PROTOCOLS = ("evalbot.serve/1", "llama-server/1", OPENAI_PROTOCOL)
HTTP_PROTOCOLS = ("llama-server/1", OPENAI_PROTOCOL)
# who provides the reference tools (the llama.cpp scores and audit answers, the KL comparison, the registry's
# fetcher): evalbot itself, or main's build package as `<package>.reference`, `.compare` and `.registry`
REFERENCES = ("evalbot", "main")
# what a serving argv may name, filled in by the harness for each process ({port}: an HTTP engine's port,
# {threads}: the CPU threads the profile gives each engine, else the cores the evaluation may use)
SERVE_FIELDS = ("python", "tree", "max_seq", "device", "warmup", "port", "threads")
BUILD_FIELDS = ("python", "jobs")  # what a build command may name: the side's venv interpreter, the cores


@dataclass(frozen=True)
class EngineSpec:
    """The contest's engine, declared in engine.yaml: the Python package its build must provide, how one is
    started serving (an argv template, the model's arguments in one of two forms), the protocol it speaks,
    and the local benchmark command contributors run (the needs-benchmark notice names it)."""

    protocol: str
    package: str | None  # pip-installed from the tree and imported in the side's venv (a smoke check)
    argv: tuple[str, ...]  # placeholders: SERVE_FIELDS ({tree}: the built tree, kept read-only)
    model_file: tuple[str, ...]  # a model file on the runner: {model}
    random_weights: tuple[str, ...]  # a shape with random weights: {shape} (empty: it serves none)
    bench: str  # {model_args}, {ctx}, {runs}
    # run in order in the sandbox, in a copy of the tree (after the package's install), no network:
    # a compiled engine's build. Placeholders: BUILD_FIELDS
    commands: tuple[tuple[str, ...], ...] = ()
    toolchain: tuple[
        str, ...
    ] = ()  # absolute read-only paths the build and the engine may read (a CUDA toolkit)
    reference: str = "evalbot"  # REFERENCES: whose reference tools the harness runs (trusted either way)
    project: str = "."  # the tree's folder whose pyproject.toml installs the package (a relative path)
    draft_args: tuple[str, ...] = ()  # a draft model for speculative requests: {draft} (empty: none)

    def serve_argv(self, model_args: list[str], **fields: str) -> list[str]:
        """The serving process's argv: the template filled in, then the model's arguments."""
        return [a.format_map(fields) for a in self.argv] + model_args

    def model_args(self, *, model: str | None = None, shape: str | None = None) -> list[str]:
        """The model's arguments: a file on the runner (`model`) or a shape with random weights."""
        if model is not None:
            return [a.format_map({"model": model}) for a in self.model_file]
        if not self.random_weights:
            raise ValueError(
                f"engine.yaml's engine serves no random weights (no serve.random_weights): not {shape}"
            )
        return [a.format_map({"shape": shape}) for a in self.random_weights]

    def draft_model_args(self, draft: str) -> list[str]:
        """The arguments that give a serving engine its draft model (a file on the runner)."""
        return [a.format_map({"draft": draft}) for a in self.draft_args]


class LabelFamily(enum.StrEnum):
    """Who owns which labels, declared once (``Rules.owned``): each producer sets only its own family, as a
    set difference, and leaves every other label alone."""

    VERDICT = "verdict"  # tiers and outcomes: verified, regression, infra-error, inconclusive, accuracy, spec, gaming
    ROUND = "round"  # merge-first, needs-rebase, re-evaluate
    INTAKE = "intake"  # skipped:sensitive, skipped:cap, needs-benchmark, stale, exhausted, the area labels
    SCREEN = "screen"  # the copycat screen's: copycat, copycat-warn
    CLAIM = "claim"  # claim-gap, beside a verdict
    PROTECTED = (
        "protected"  # set by a screen, policy or a maintainer; no poll takes them off, `evalbot clear` does
    )
    CLEARED = "cleared"  # the flags `evalbot clear` takes off a false positive


@dataclass(frozen=True)
class Rules:
    """Every rule, validated. ``rules_hash`` covers the content, not ``source_dir`` or formatting."""

    tiers: tuple[Tier, ...]
    gates: Gates
    profiles: tuple[Profile, ...]
    spec_pair: SpecPair
    copycat: Copycat
    policy: Policy
    labels: Labels
    automerge: Automerge
    dispatch: Dispatch
    engine: EngineSpec
    source_dir: Path
    rules_hash: str
    tracks: tuple[Track, ...] = ()  # tracks.yaml; empty: default_tracks (see `scoring`)

    @property
    def scoring(self) -> tuple[Track, ...]:
        """The scored tracks: tracks.yaml's, or the default (one decode track over every profile's models)."""
        return self.tracks or default_tracks(self.profiles)

    def tracks_for(self, profile: str) -> tuple[Track, ...]:
        """The tracks as they apply to one profile, each with that profile's models only. A profile that no
        decode track names is scored as profiles.yaml says: every model at its scored contexts, no label."""
        out = [replace(t, models=t.entries(profile)) for t in self.scoring if t.entries(profile)]
        if not any(t.metric == DECODE_TRACK for t in out):
            (default,) = default_tracks(tuple(p for p in self.profiles if p.name == profile))
            out.insert(0, default)
        return tuple(out)

    def model_profile(self, profile: Profile, model: str) -> Profile:
        """The profile as one of its models is measured: its contexts scored where a decode track scores that
        model (none: the model is a guard, every context guarded and none scored)."""
        scored = {c for t in self.tracks_for(profile.name) if t.metric == DECODE_TRACK for e in t.models
                  if e.model == model for c in e.contexts}  # fmt: skip
        contexts = tuple(replace(c, scored=c.ctx in scored) for c in profile.contexts)
        return replace(profile, contexts=contexts)

    def spec_contexts(self, profile: Profile, model: str) -> tuple[int, ...]:
        """Where the spec runs measure a model: the contexts a speculative track scores it at, else its
        decode-scored contexts (the spec gates alone)."""
        named = {c for t in self.tracks_for(profile.name) if t.metric == SPEC_TRACK for e in t.models
                 if e.model == model for c in e.contexts}  # fmt: skip
        if named:
            return tuple(c.ctx for c in profile.contexts if c.ctx in named)
        return self.model_profile(profile, model).scored_contexts

    def spec_runs(self, profile: str, model: str) -> int:
        """Speculative runs per context for this model: gates.spec.runs, or more where a speculative track
        scoring it asks for more (a rate needs more pairs than a pass/fail gate)."""
        asked = [t.runs for t in self.tracks_for(profile) if t.metric == SPEC_TRACK and t.runs
                 for e in t.models if e.model == model]  # fmt: skip
        return max([self.gates.spec.runs, *asked])

    def spec_drafter(self, profile: str, model: str) -> str:
        """How a speculative track drafts for this model ('ngram' where no track says 'draft')."""
        return next((t.drafter for t in self.tracks_for(profile) if t.metric == SPEC_TRACK for e in t.models
                     if e.model == model), "ngram")  # fmt: skip

    def track_labels(self) -> frozenset[str]:
        """Every per-model label a track can set (each prefix with each tier and 'none')."""
        return frozenset(
            label
            for t in self.scoring
            for m in t.models
            for tier in (*(x.name for x in self.tiers), None)
            if (label := m.label_for(tier)) is not None
        )

    @property
    def harness_modules(self) -> tuple[str, ...]:
        """policy.harness_modules, and where main brings the reference tools (engine.yaml `reference: main`)
        their three modules too: a PR that could change them would change its own yardstick."""
        mine = self.policy.harness_modules
        if self.engine.reference != "main" or self.engine.package is None:
            return mine
        tools = tuple(f"{self.engine.package}.{tool}" for tool in ("reference", "compare", "registry"))
        return (*mine, *(t for t in tools if t not in mine))

    def owned(self, family: LabelFamily) -> frozenset[str]:
        """The labels of one family (see LabelFamily)."""
        lab = self.labels
        match family:
            case LabelFamily.VERDICT:
                return frozenset(
                    [
                        *(t.label for t in self.tiers),
                        lab.verified,
                        lab.regression,
                        lab.infra_error,
                        lab.inconclusive,
                        lab.accuracy_fail,
                        lab.spec_fail,
                        lab.gaming,
                        *self.track_labels(),
                    ]
                )
            case LabelFamily.ROUND:
                return frozenset({lab.merge_first, lab.needs_rebase, lab.re_evaluate})
            case LabelFamily.INTAKE:
                own = (lab.skipped_sensitive, lab.skipped_cap, lab.needs_benchmark, lab.stale, lab.exhausted)
                return frozenset([*own, *(a.label for a in self.policy.areas)])
            case LabelFamily.SCREEN:
                return frozenset({lab.copycat, lab.copycat_warn})
            case LabelFamily.CLAIM:
                return frozenset({lab.claim_gap})
            case LabelFamily.PROTECTED:
                return frozenset({lab.copycat, lab.copycat_warn, lab.gaming, lab.hold})
            case LabelFamily.CLEARED:
                return frozenset({lab.gaming, lab.copycat, lab.copycat_warn, lab.exhausted})
        raise ValueError(f"unknown label family {family!r}")

    def profile(self, name: str) -> Profile:
        """The profile of this name; KeyError otherwise."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(name)

    # The tiers' data only. An estimate earns its tier in `stats.classify` (from these bounds and its CI's
    # lower bound), called by `verdict.decide` and the stats CLI; the verdict keeps the best tier by
    # `tier_rank`, and `rounds` ranks PASSes by their lower-bound gain, not by tier.

    @property
    def tier_bounds(self) -> tuple[tuple[str, float], ...]:
        """(name, lowest lower-bound gain) per tier, lowest first."""
        return tuple((t.name, t.lower_bound) for t in self.tiers)

    def track_bounds(self, track: Track) -> tuple[tuple[str, float], ...]:
        """(name, lowest lower-bound gain) per tier in this track: its own, else tiers.yaml's."""
        return track.tiers or self.tier_bounds

    def tier(self, name: str) -> Tier:
        """The tier of this name; KeyError otherwise."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def tier_rank(self, name: str | None) -> int:
        """0 for no tier, else 1 for the lowest tier up to len(tiers) for the highest."""
        names = [t.name for t in self.tiers]
        return names.index(name) + 1 if name in names else 0


# What a track scores: "decode" is autoregressive decode tok/s on the clock the verdict picks (wall or the
# engine's CPU time); "spec" is speculative decode tok/s on the harness's clock, with AR decode as a floor.
DECODE_TRACK, SPEC_TRACK = "decode", "spec"
TRACK_METRICS = (DECODE_TRACK, SPEC_TRACK)
DRAFTERS = ("ngram", "draft")  # n-gram prompt lookup in the target itself, or models.yaml's spec draft model
NO_TIER = "none"  # a per-model label's value where the model earned no tier


@dataclass(frozen=True)
class TrackModel:
    """One model in a track: its profile, the contexts where it is scored (none: a guard, measured and
    guarded, never scored) and its label's prefix (``<label>:<tier>``, ``<label>:none``; None: no label)."""

    profile: str
    model: str
    contexts: tuple[int, ...]
    label: str | None = None

    @property
    def guard(self) -> bool:
        return not self.contexts

    def label_for(self, tier: str | None) -> str | None:
        return None if self.label is None else f"{self.label}:{tier or NO_TIER}"


@dataclass(frozen=True)
class Track:
    """A scored track (tracks.yaml): its metric, its models per profile, its drafter (spec only), and
    whether its results count toward the overall tier label (labels.yaml's tiers)."""

    name: str
    metric: str
    models: tuple[TrackModel, ...]
    drafter: str = "ngram"
    overall: bool = True
    implicit: bool = False  # no tracks.yaml entry: profiles.yaml's scored contexts, for whatever was measured
    runs: int | None = None  # spec only: speculative runs per context (at least gates.spec.runs)
    # the track's own lower bounds for tiers.yaml's tiers, lowest first (empty: tiers.yaml's): a rate that
    # varies prompt to prompt (speculation) cannot resolve decode's 2% floor
    tiers: tuple[tuple[str, float], ...] = ()

    def entries(self, profile: str) -> tuple[TrackModel, ...]:
        return tuple(m for m in self.models if m.profile == profile)

    def scored(self, profile: str, model: str) -> tuple[int, ...]:
        """The contexts where this model is scored in this track on this profile (empty: not scored)."""
        return next((m.contexts for m in self.models if m.profile == profile and m.model == model), ())


def default_tracks(profiles: tuple[Profile, ...]) -> tuple[Track, ...]:
    """Without tracks.yaml: one decode track scoring every model at its profile's scored contexts."""
    models = tuple(TrackModel(p.name, m.name, p.scored_contexts) for p in profiles for m in p.models)
    return (Track(DECODE_TRACK, DECODE_TRACK, models, implicit=True),)


RULES_MARKER = "profiles.yaml"  # a folder named rules/ holding this is a contest's rules


def default_rules_dir(start: Path | None = None) -> Path:
    """The contest repository's rules/ folder: in `start` (default: the working directory) or the nearest
    folder above it, never beside the installed package (an installed evalbot serves any contest).
    RulesError where there is none."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "rules" / RULES_MARKER).is_file():
            return folder / "rules"
        if (folder / ".git").exists():
            break  # the checkout's root: its rules or none, never a folder's above it
    raise RulesError(
        str(here),
        None,
        "",
        f"no rules/ folder (with {RULES_MARKER}) here or in a folder above, up to the checkout's root: run "
        "evalbot from the contest repository's checkout, or name the rules with --rules DIR",
    )


def automerge_allowed(rules: Rules, env: Mapping[str, str]) -> bool:
    """Auto-merge needs both the rules' consent and the operator's (``EVALBOT_AUTOMERGE=1`` in env)."""
    return rules.automerge.enabled and env.get(AUTOMERGE_ENV) == "1"


def rules_hash(rules: Rules) -> str:
    """sha256 (hex) of the canonical JSON of the validated content."""
    blob = json.dumps(
        _plain(rules), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, Rules):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in fields(value)
            if f.name not in ("source_dir", "rules_hash")
        }
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


__all__ = [
    "AUTOMERGE_ENV",
    "BUILD_FIELDS",
    "DECODE_TRACK",
    "DEVICES",
    "DISPATCH_MODES",
    "DRAFTERS",
    "FILES",
    "HTTP_PROTOCOLS",
    "LOGIN",
    "NO_TIER",
    "OPTIONAL_FILES",
    "PROTOCOLS",
    "SERVE_FIELDS",
    "SPEC_TRACK",
    "TRACK_METRICS",
    "AccuracyGate",
    "Area",
    "Automerge",
    "Containment",
    "Context",
    "Copycat",
    "DecodeAuditGate",
    "Dispatch",
    "EngineSpec",
    "Gates",
    "LabelFamily",
    "Labels",
    "Measurement",
    "ModelRef",
    "NoRegressionGate",
    "Policy",
    "Profile",
    "Quiet",
    "Rules",
    "RulesError",
    "SpecGate",
    "SpecPair",
    "Stale",
    "Strikes",
    "Template",
    "Tier",
    "TimingGate",
    "TinyPr",
    "Track",
    "TrackModel",
    "Winnowing",
    "automerge_allowed",
    "default_rules_dir",
    "default_tracks",
    "is_login",
    "rules_hash",
]
