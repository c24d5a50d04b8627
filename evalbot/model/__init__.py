"""The bot's plain data: what was measured (Measurements) and what was decided (Verdict).

Frozen dataclasses only, so that evaluate, verdict, render, receipts and publish can pass them around and
tests can build them by hand. Every type round-trips through ``to_dict`` / ``from_dict`` (in
``evalbot.codec``) as plain JSON data (result.json, the comment's embedded state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from evalbot.model.github import (  # re-exported: the package's data, by topic
    Artifact as Artifact,
)
from evalbot.model.github import (
    Comment as Comment,
)
from evalbot.model.github import (
    Commit as Commit,
)
from evalbot.model.github import (
    FileChange as FileChange,
)
from evalbot.model.github import (
    MergeOutcome as MergeOutcome,
)
from evalbot.model.github import (
    MergeResult as MergeResult,
)
from evalbot.model.github import (
    PullRequest as PullRequest,
)
from evalbot.model.github import (
    WorkflowRun as WorkflowRun,
)
from evalbot.rules import Profile


class Status(enum.StrEnum):
    """The outcome of one evaluation."""

    PASS = "PASS"
    REJECT = "REJECT"
    INFRA_ERROR = "INFRA_ERROR"  # never the contributor's fault, never counts against them
    SKIPPED = "SKIPPED"
    # the box could not resolve the smallest tier (MDE above its floor): infra-class, measured again
    INCONCLUSIVE = "INCONCLUSIVE"


class Side(enum.StrEnum):
    BASE = "base"
    HEAD = "head"
    HARNESS = "harness"  # the trusted bot/harness itself, or the box


MAX_MESSAGE_CHARS = 2000
MAX_LOG_TAIL_CHARS = 8000


def cap_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """text cut to at most limit characters, saying how much was cut (the start, or the end kept)."""
    if len(text) <= limit:
        return text
    note = f" […{len(text) - limit} characters cut]"
    room = max(limit - len(note), 0)
    return (note.strip() + " " + text[-room:]) if keep_end else text[:room] + note


@dataclass(frozen=True)
class Failure:
    """Something that went wrong while measuring, and on which side. Message and log tail are capped
    here, once for every producer: whatever a PR prints, a failure stays a few kilobytes."""

    side: Side
    stage: str  # "build", "toolchain", "run", "parse", "schema", "gpu", "timeout", ...
    message: str
    log_tail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", cap_text(str(self.stage), 80))
        object.__setattr__(self, "message", cap_text(str(self.message), MAX_MESSAGE_CHARS))
        object.__setattr__(self, "log_tail", cap_text(str(self.log_tail), MAX_LOG_TAIL_CHARS, keep_end=True))


# The decode clocks a verdict may score (at each context exactly one does; verdict.score_clocks picks it):
# wall time, and the CPU time of the engine's process tree. "decode_utilization" pairs (CPU seconds per
# wall second, head against main) decide between them and score nothing themselves.
DECODE_METRICS = ("decode_tps", "decode_cpu_tps")
UTILIZATION_METRIC = "decode_utilization"


@dataclass(frozen=True)
class ThroughputPairs:
    """Interleaved (base, head) throughput samples for one model at one context."""

    model: str
    context: int
    metric: str  # "decode_tps" (wall clock), "decode_cpu_tps" (the engine's CPU time), "prefill_tps"
    pairs: tuple[tuple[float, float], ...]
    guarded: bool = True  # a regression here rejects the PR
    scored: bool = True  # a gain here can earn a tier
    # per pair, (main, PR): each engine process's wall seconds seen from outside, and the seconds its
    # own timings report (load + warm-up + timed runs); the difference is time nobody accounted for
    walls: tuple[tuple[float, float], ...] = ()
    reported: tuple[tuple[float, float], ...] = ()
    # per pair, the process block it was measured in: pairs of one block share their processes, so the
    # CI treats blocks as clusters (stats.estimate_blocked); empty for fresh-process pairs
    blocks: tuple[int, ...] = ()
    # per pair, whether main's process of its block was loaded first: blocks alternate, and the estimate
    # is a crossover that cancels the load-order effect (stats.crossover); empty where nothing alternated
    base_first: tuple[bool, ...] = ()


@dataclass(frozen=True)
class AccuracyResult:
    """The head engine's logits against the reference (llama.cpp) on the same GGUF and tokens."""

    model: str
    positions: int
    top1_agreement: float
    kl_mean: float
    ppl_ratio: float
    base_top1_agreement: float | None = None
    base_kl_mean: float | None = None
    reference: str = "llama.cpp"  # the reference's name, as its score record gives it
    # perplexities over the same tokens: the PR's, main's and the reference's (None: not recorded)
    ppl: float | None = None
    base_ppl: float | None = None
    reference_ppl: float | None = None


@dataclass(frozen=True)
class DecodeAudit:
    """The timed tokens of one side at one context, checked against a reference (teacher-forced on them)."""

    model: str
    context: int
    side: Side
    reference: str  # "llama.cpp", or "main" where the weights are random (no file for llama.cpp)
    requests: int
    tokens: int
    agreeing: int  # generated tokens that are the reference's top-1
    near_ties: int  # disagreements where the reference's top two are closer than the rules' bound
    violations: int  # disagreements that are not near-ties
    worst: tuple[dict[str, Any], ...] = ()  # the largest-margin violations: request, position, margin

    @property
    def share(self) -> float:
        """Share of generated tokens that agree with the reference's top-1."""
        return self.agreeing / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class SpecResult:
    """Speculative decoding, base vs head, same prompts and drafter."""

    target: str
    drafter: str
    block_size: int
    runs: int
    lossless_runs: int  # head runs whose tokens equal the head's own AR tokens
    first_divergence: int | None
    base_tau: float
    head_tau: float
    ar_pairs: tuple[tuple[float, float], ...] = ()  # (base, head) AR tok/s
    spec_pairs: tuple[tuple[float, float], ...] = ()  # (base, head) speculative tok/s
    context: int | None = None  # prompt tokens (served runs measure spec at every scored context)
    base_tau_runs: tuple[float, ...] = ()  # per run: tokens committed per verify step, as streamed
    head_tau_runs: tuple[float, ...] = ()
    # every verify step's committed tokens over all runs (the streamed lines after the first): tau's spread
    base_tau_steps: tuple[int, ...] = ()
    head_tau_steps: tuple[int, ...] = ()
    # per run: the A/B block (0-based) whose pair of serving processes ran it (empty: not recorded)
    spec_blocks: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PrIdentity:
    """Which pull request an evaluation is of, as its request and its receipt name it (None and empty for
    revisions evaluated outside a PR)."""

    pr: int | None = None
    title: str = ""
    author: str = ""
    branch: str = ""

    def pr_identity(self) -> dict[str, Any]:
        """These fields by name, to carry them from a request to its provenance."""
        return {f.name: getattr(self, f.name) for f in fields(PrIdentity)}


@dataclass(frozen=True)
class Provenance(PrIdentity):
    """Where the numbers came from: revisions, policy, models, engine builds, box, prompts, times."""

    repo: str
    base_sha: str  # main, as measured against
    head_sha: str  # the PR's head
    harness_sha: str
    rules_hash: str
    profile: str
    model_sha256s: dict[str, str] = field(default_factory=dict)
    engine_build: dict[str, Any] = field(default_factory=dict)
    box: dict[str, Any] = field(default_factory=dict)
    measured_sha: str = (
        ""  # what was built and timed: the head merged into main (the head when it holds main)
    )
    # per model: the llama.cpp reference's identity (version, pinned build flags, sha256 of its libraries)
    reference: dict[str, Any] = field(default_factory=dict)
    prompt_seed: int | None = None
    corpus_sha256: str | None = None
    started_at: str = ""
    finished_at: str = ""


@dataclass(frozen=True)
class RunOptions:
    """How one run measures, beyond what the rules fix: what a maintainer may set for a manual run."""

    seed: int | None = None  # the prompt draw (None: a fresh random one)
    spec: bool = True  # run the speculative-decoding gates
    spec_drafter: str = "ngram"  # "ngram" (the profile's model) or "draft" (the rules' target/draft pair)
    accuracy: bool = True  # run the llama.cpp accuracy gates
    max_pairs: int | None = None  # overrides the profile's, e.g. for a quick demo
    positions: int = 128  # the accuracy gates' scored positions
    no_sandbox: bool = False  # run engine code without bubblewrap (only for code the operator trusts)


@dataclass(frozen=True)
class EvalRequest(PrIdentity):
    """One evaluation, carried whole from where it is made (the poller, `evalbot evaluate`, a dispatched
    run) to the receipt: the PR, the revisions (main, the PR's head, and the merge of the two that is
    built and timed, made once by whoever made the request), the rules it is judged under, and how."""

    base_sha: str  # main, as measured against
    head_sha: str  # the PR's head
    measured_sha: str | None  # the head merged into main (the head where it holds main); None: conflicts
    rules_hash: str
    profile: Profile
    options: RunOptions = RunOptions()


@dataclass(frozen=True)
class Measurements:
    """Everything evaluate measured for one (base, head) pair; never a verdict."""

    provenance: Provenance
    throughput: tuple[ThroughputPairs, ...] = ()
    accuracy: tuple[AccuracyResult, ...] = ()
    spec: tuple[SpecResult, ...] = ()
    failures: tuple[Failure, ...] = ()
    skipped_reason: str | None = None
    reproduce: str = ""  # the exact command that reproduces the run locally
    audits: tuple[DecodeAudit, ...] = ()  # the timed tokens, checked against the reference
    # what the harness noticed that decides nothing: the engine's own timings far from the harness's
    # clock, the engine's own token count disagreeing with what it streamed, a tau that moved
    diagnostics: tuple[str, ...] = ()
    # the box's state at every A/B pair: time, model, context, pair, CPU load, the cores other processes
    # used before and during the pair (and their names), the seconds waited for a quiet box, and the
    # GPU's clocks, temperature and utilization when nvidia-smi answers
    box_samples: tuple[dict[str, Any], ...] = ()


class GateKind(enum.StrEnum):
    """What a gate checks. Code matches gates by kind; the name is only what the report shows."""

    REGRESSION = "regression"  # no guarded context slower than main
    DECODE_AUDIT = "decode_audit"  # the timed tokens agree with the reference
    ACCURACY = "accuracy"  # teacher-forced agreement with the reference (top-1, KL)
    SPEC = "spec"  # speculative decoding: lossless, tau, plain decode speed
    HEAD = "head"  # the head's own build or run failed


_KIND_OF_NAME = (
    ("no regression", GateKind.REGRESSION),
    ("decode agreement", GateKind.DECODE_AUDIT),
    ("accuracy", GateKind.ACCURACY),
    ("spec", GateKind.SPEC),
    ("head", GateKind.HEAD),
)


@dataclass(frozen=True)
class Gate:
    """One check, with its measured value, its bar and whether it passed."""

    name: str
    value: float | None
    bar: str  # human-readable bar, e.g. ">= 0.98x main (CI upper bound)"
    passed: bool
    detail: str = ""
    context: int | None = None
    model: str | None = None
    kind: GateKind | None = None  # None only in a verdict stored before gates had kinds: read from its name

    def __post_init__(self) -> None:
        if self.kind is None:
            kind = next((k for prefix, k in _KIND_OF_NAME if self.name.startswith(prefix)), None)
            if kind is None:
                raise ValueError(f"gate {self.name!r}: no kind given, and the name names none")
            object.__setattr__(self, "kind", kind)


@dataclass(frozen=True)
class ContextEstimate:
    """The paired A/B estimate at one context, as the report shows it."""

    model: str
    context: int
    metric: str
    n: int
    base_median: float
    head_median: float
    ratio: float
    ci_low: float
    ci_high: float
    mde: float
    tier: str | None
    regression: bool
    guarded: bool
    scored: bool
    df: int | None = None  # the interval's degrees of freedom (None: a record from before it was kept)


@dataclass(frozen=True)
class TrackScore:
    """One model's result in one track (tracks.yaml): the estimate at its strongest scored context, the tier it
    earned there (None: none), the label it sets (None: the track gives this model none), and a note where
    the tier is held back (an interval too wide to resolve it)."""

    track: str
    metric: str  # the track's: "decode" or "spec"
    model: str
    tier: str | None
    label: str | None
    estimate: ContextEstimate | None  # None: nothing measured for this model in this track
    note: str = ""
    overall: bool = True  # counts toward the overall tier

    @property
    def lower_bound_gain(self) -> float | None:
        """The 95% CI's lower bound of the gain (a fraction) at the scored context: what a track's round ranks."""
        return None if self.estimate is None else self.estimate.ci_low - 1


@dataclass(frozen=True)
class Verdict:
    """The decision for one evaluation: status, tier, gates, reasons and the verdict labels it sets."""

    status: Status
    tier: str | None
    scored_context: int | None
    gates: tuple[Gate, ...]
    reasons: tuple[str, ...]
    labels_add: tuple[str, ...]  # the verdict labels to set; the family's others go (rules.owned)
    estimates: tuple[ContextEstimate, ...] = ()
    rules_hash: str = ""
    mde: float | None = None  # the largest per-context MDE among scored contexts
    # Computed once from the fields above when the Verdict is made (by verdict.decide, or read back from
    # the store); given values are replaced, so they can never disagree with the estimates:
    headline: ContextEstimate | None = None  # what a summary shows: the worst regression on a REJECT, else
    # the scored context's decode estimate, else the best scored one
    lower_bound_gain: float | None = None  # the 95% CI's lower bound of the decode gain (a fraction) at
    # the scored context, else the best over the scored decode estimates; rounds rank by it
    scores: tuple[TrackScore, ...] = ()  # per track and model (tracks.yaml), in the rules' order

    def track_gain(self, track: str) -> float | None:
        """The best lower-bound gain of this track's scored models (what its round ranks), None if none."""
        return max((g for s in self.scores if s.track == track and (g := s.lower_bound_gain) is not None),
                   default=None)  # fmt: skip

    # Read back from records written before #37 (the store, result.json, receipts) and ignored: the labels
    # to remove were always the verdict family's others, which whoever applies a verdict computes.
    RETIRED_FIELDS: ClassVar[frozenset[str]] = frozenset({"labels_remove"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "headline", _headline(self))
        object.__setattr__(self, "lower_bound_gain", _lower_bound_gain(self))


def _headline(v: Verdict) -> ContextEstimate | None:
    if not v.estimates:
        return None
    regressions = [e for e in v.estimates if e.regression]
    if v.status is Status.REJECT and regressions:
        return min(regressions, key=lambda e: e.ci_high)
    scored = [e for e in v.estimates if e.scored]
    at = [e for e in scored if e.context == v.scored_context and e.metric in DECODE_METRICS]
    at = at or [e for e in scored if e.context == v.scored_context]
    if at:  # several models scored there: the one that earned the most
        return max(at, key=lambda e: e.ci_low)
    return max(scored, key=lambda e: e.ci_low, default=v.estimates[0])


def _lower_bound_gain(v: Verdict) -> float | None:
    scored = [e for e in v.estimates if e.scored and e.metric in DECODE_METRICS]
    if v.scored_context is not None:
        scored = [e for e in scored if e.context == v.scored_context] or scored
    return max((e.ci_low - 1 for e in scored), default=None)


@dataclass(frozen=True)
class Prose:
    """Words for a PR by template: ``templates/notices/<template>.md.j2`` renders ``data`` (escaping what a
    contributor controls), so the code that decides never writes the sentences."""

    template: str
    data: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, template: str, **data: Any) -> Prose:
        """Prose from keyword data; sequences are given as tuples, so the value stays frozen."""
        return cls(template, tuple(sorted(data.items())))


@dataclass(frozen=True)
class Notice:
    """The PR's bot comment for a decision that is not a measured verdict: its kind (named in the comment's
    hidden state), its title and plain-text lines (escaped when rendered), and the rules' prose below them."""

    kind: str  # close, skip, screen, infra, rebase
    title: str
    lines: tuple[str, ...] = ()
    prose: tuple[Prose, ...] = ()


@dataclass(frozen=True)
class Decision:
    """What one producer decides about one PR (intake policy, the copycat screen, an infra error, a
    needs-rebase, a published verdict, a round's labels), in the one shape ``Publisher.apply`` acts on:
    the labels wanted within the family the producer owns (a set difference: every other label is left
    alone), the PR's one bot comment (a notice, or a rendered verdict), a commit status, a close, whether
    evaluation goes ahead, a FLAGGED.md entry, and a line for the poll."""

    labels: tuple[str, ...]
    owned: tuple[str, ...]  # the producer's label family (rules.owned)
    evaluate: bool = True
    notice: Notice | None = None
    comment: str | None = None  # a whole bot comment already rendered (a verdict's); never with a notice
    status: tuple[str, str] | None = None  # a commit status on the head: (state, description)
    close: str | None = None  # why the PR is closed; None leaves it open
    flag: str | None = None  # the label written into FLAGGED.md
    note: str | None = None  # one line for the poll's report

    def __post_init__(self) -> None:
        if self.notice is not None and self.comment is not None:
            raise ValueError("a decision has one bot comment: a notice or a rendered comment, not both")
