"""The contest's rules: ``rules/*.yaml`` validated into frozen dataclasses.

This is the only module that imports yaml. Every error names the file, the line and the field, and
says what was expected, e.g. ``rules/gates.yaml:12: gates.accuracy.top1_min: expected a number in
[0, 1], got 'high'``. Lines come from the marks on the composed YAML node tree, so they point at the
offending key or value, not at the start of the file.

Dataclass fields mirror the YAML (``gates.accuracy.top1_min`` is ``rules.gates.accuracy.top1_min``),
except that tier labels join their ``Tier`` and each profile's models join their ``Profile``.
Every key is required: the defaults live in the shipped YAML, not here.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

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
)

AUTOMERGE_ENV = "EVALBOT_AUTOMERGE"
DISPATCH_MODES = ("local", "actions")
DEVICES = ("cuda", "cpu")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# the one pattern a GitHub login must match, wherever one is accepted (rules, the CLI, the ledgers, the
# store): letters, digits and hyphens, at most 39, not starting with a hyphen; an app's "name[bot]" too
LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")
_LOGIN = LOGIN


def is_login(text: object) -> bool:
    """Whether text is a well-formed GitHub login (LOGIN, matched whole)."""
    return isinstance(text, str) and LOGIN.fullmatch(text) is not None
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_LABEL = 50  # GitHub refuses longer label names


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


# ---------------------------------------------------------------- the rules


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


@dataclass(frozen=True)
class Quiet:
    """When the box counts as quiet (nothing but this evaluation using it), and how long to wait for it."""

    max_other_cores: float = 0.3  # CPU used by other processes, in cores, over one sample
    max_gpu_util: float = 10.0  # % GPU utilization while our engines do not run (gpu profile)
    sample_s: float = 2.0
    max_wait_s: float = 300.0  # past it, INFRA_ERROR "box busy"


@dataclass(frozen=True)
class ModelRef:
    """A registry model pinned by sha256, or a named shape with random weights (sha256 None)."""

    name: str
    source: str  # "registry" | "shape"
    sha256: str | None


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
    def guarded_contexts(self) -> tuple[int, ...]:
        """The context lengths that must not regress."""
        return tuple(c.ctx for c in self.contexts if c.guarded)

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
    # actions mode: the workflow_dispatch workflow, the trusted ref it runs from, how long one run may take
    # (queued included) before it is abandoned, and how many runs one evaluation may use in all
    workflow: str = "evalbot-eval.yml"
    ref: str = "main"
    timeout_minutes: int = 120
    max_attempts: int = 3


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
    source_dir: Path
    rules_hash: str

    def profile(self, name: str) -> Profile:
        """The profile of this name; KeyError otherwise."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(name)

    # The tier rule, in one place: verdicts, rounds, the stats CLI and the renderer all ask here.

    @property
    def tier_bounds(self) -> tuple[tuple[str, float], ...]:
        """(name, lowest lower-bound gain) per tier, lowest first."""
        return tuple((t.name, t.lower_bound) for t in self.tiers)

    def tier_for(self, lower_bound_gain: float) -> Tier | None:
        """The highest tier whose lower bound is at most the gain's CI lower bound; None below the first."""
        earned = [t for t in self.tiers if t.lower_bound <= lower_bound_gain]
        return earned[-1] if earned else None

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


# ---------------------------------------------------------------- public helpers


def default_rules_dir() -> Path:
    """The repository's rules/ folder, beside this package."""
    return Path(__file__).resolve().parent.parent / "rules"


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


def load_rules(directory: str | Path) -> Rules:
    """Read and validate every rules file in the directory; RulesError on the first problem."""
    root = Path(directory)
    if not root.is_dir():
        raise RulesError(str(root), None, "", "expected a directory of rules files")
    present = sorted(p.name for p in root.iterdir() if p.suffix in (".yaml", ".yml"))
    for name in present:
        if name not in FILES:
            hint = _did_you_mean(name, FILES)
            raise RulesError(
                str(root / name), None, "", f"unknown rules file{hint}; expected only: {', '.join(FILES)}"
            )
    for name in FILES:
        if name not in present:
            raise RulesError(str(root / name), None, "", "missing required rules file")

    docs = {name.removesuffix(".yaml"): _compose(root / name) for name in FILES}
    tier_bounds = _tiers(*docs["tiers"])
    tiers, labels = _labels(*docs["labels"], tier_bounds)
    gates = _gates(*docs["gates"])
    profiles = _profiles(*docs["profiles"])
    profiles, spec_pair = _models(*docs["models"], profiles)
    copycat = _copycat(*docs["copycat"])
    policy = _policy(*docs["policy"], _label_owners(tiers, labels))
    known = _label_owners(tiers, labels) | {a.label: f"policy.areas.{a.label}" for a in policy.areas}
    automerge = _automerge(*docs["automerge"], tiers, known)
    dispatch = _dispatch(*docs["dispatch"])
    rules = Rules(tiers, gates, profiles, spec_pair, copycat, policy, labels, automerge, dispatch, root, "")
    return replace(rules, rules_hash=rules_hash(rules))


# ---------------------------------------------------------------- reading nodes


def _join(field: str, key: str | int) -> str:
    return f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}"


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """A value as the error's ``got``, in YAML's words where Python's differ."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _range(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if hi is None:
        return f"a number {'>' if lo_open else '>='} {lo:g}"
    return f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


class _File:
    """One rules file: its display name, its field prefix, and checks that turn nodes into values."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.stem = path.stem

    def fail(self, node: yaml.Node | None, field: str, message: str) -> NoReturn:
        raise RulesError(self.name, None if node is None else node.start_mark.line + 1, field, message)

    def describe(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        try:
            return _show(yaml.constructor.SafeConstructor().construct_object(node))
        except yaml.YAMLError:
            return repr(node.value)

    def items(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """(key, key node, value node) of a mapping, in file order; duplicate keys are errors."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, field, f"expected a mapping, got {self.describe(node)}")
        seen: dict[str, int] = {}
        out = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(key_node, field, f"expected a text key, got {self.describe(key_node)}")
            # The raw text, not the resolved value: a key such as `on` or `1` is still just a name.
            key = key_node.value
            if key in seen:
                self.fail(key_node, _join(field, key), f"duplicate key (first on line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
            out.append((key, key_node, value_node))
        return out

    def mapping(self, node: yaml.Node, field: str, keys: Sequence[str]) -> dict[str, yaml.Node]:
        """The values of a mapping that must have exactly these keys."""
        got = {}
        for key, key_node, value_node in self.items(node, field):
            if key not in keys:
                hint = _did_you_mean(key, keys)
                self.fail(
                    key_node, _join(field, key), f"unknown key{hint}; expected one of: {', '.join(keys)}"
                )
            got[key] = value_node
        for key in keys:
            if key not in got:
                self.fail(node, _join(field, key), f"missing; this mapping needs: {', '.join(keys)}")
        return got

    def sequence(self, node: yaml.Node, field: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, field, f"expected a list, got {self.describe(node)}")
        return list(node.value)

    def scalar(self, node: yaml.Node, field: str, expected: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, field, f"expected {expected}, got {self.describe(node)}")
        try:
            return yaml.constructor.SafeConstructor().construct_object(node)
        except yaml.YAMLError as exc:
            self.fail(
                node, field, f"expected {expected}, got {node.value!r} ({getattr(exc, 'problem', exc)})"
            )

    def number(
        self,
        node: yaml.Node,
        field: str,
        lo: float,
        hi: float | None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        expected = _range(lo, hi, lo_open, hi_open)
        value = self.scalar(node, field, expected)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > lo if lo_open else value >= lo)
        ok = ok and (hi is None or (value < hi if hi_open else value <= hi))
        if not ok:
            self.fail(node, field, f"expected {expected}, got {_show(value)}")
        return float(value)

    def fraction(self, node: yaml.Node, field: str) -> float:
        return self.number(node, field, 0, 1)

    def ratio(self, node: yaml.Node, field: str) -> float:
        """A share of main's figure: above 0, at most 1 (a gate asking for more than main is a typo)."""
        return self.number(node, field, 0, 1, lo_open=True)

    def integer(self, node: yaml.Node, field: str, minimum: int = 1) -> int:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        value = self.scalar(node, field, expected)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(node, field, f"expected {expected}, got {_show(value)}")
        return value

    def boolean(self, node: yaml.Node, field: str) -> bool:
        value = self.scalar(node, field, "true or false")
        if not isinstance(value, bool):
            self.fail(node, field, f"expected true or false, got {_show(value)}")
        return value

    def text(
        self, node: yaml.Node, field: str, pattern: re.Pattern[str] | None = None, what: str = "a string"
    ) -> str:
        value = self.scalar(node, field, what)
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.fullmatch(value)):
            self.fail(node, field, f"expected {what}, got {_show(value)}")
        return value

    def choice(self, node: yaml.Node, field: str, choices: Sequence[str], what: str) -> str:
        """A string that must be one of choices (a reference to a name defined elsewhere)."""
        expected = f"{what} (one of: {', '.join(choices)})"
        value = self.scalar(node, field, expected)
        if value not in choices:
            hint = _did_you_mean(value, choices) if isinstance(value, str) else ""
            self.fail(node, field, f"expected {expected}, got {_show(value)}{hint}")
        return value

    def sha256(self, node: yaml.Node, field: str) -> str:
        what = "a sha256 (64 lowercase hex digits)"
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, field, f"expected {what}, got {self.describe(node)}")
        # The raw text: an all-digit hash would otherwise resolve to an int.
        if not _SHA256.fullmatch(node.value):
            self.fail(node, field, f"expected {what}, got {node.value!r}")
        return node.value

    def label(self, node: yaml.Node, field: str) -> str:
        what = f"a label name (1-{_MAX_LABEL} characters, no surrounding spaces)"
        value = self.text(node, field, what=what)
        if len(value) > _MAX_LABEL or value != value.strip():
            self.fail(node, field, f"expected {what}, got {value!r}")
        return value

    def path_pattern(self, node: yaml.Node, field: str) -> str:
        what = "a repository-relative path or glob (no leading '/')"
        value = self.text(node, field, what=what)
        if value.startswith("/"):
            self.fail(node, field, f"expected {what}, got {value!r}")
        return value


_MAX_RULES_CHARS = 1_000_000
_MAX_DEPTH = 32


def _check_depth(f: _File, text: str) -> None:
    """RulesError at the first collection nested deeper than _MAX_DEPTH (the parser is iterative)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise RulesError(f.name, line, f.stem, f"nested deeper than {_MAX_DEPTH} levels; rules are flat")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _compose(path: Path) -> tuple[_File, yaml.Node]:
    """A file's node tree; syntax errors carry YAML's own line and column."""
    f = _File(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        f.fail(None, f.stem, f"expected UTF-8 text ({exc.reason} at byte {exc.start})")
    if len(text) > _MAX_RULES_CHARS:
        f.fail(None, f.stem, f"expected a rules file under {_MAX_RULES_CHARS:,} characters, got {len(text):,}")
    try:
        _check_depth(f, text)  # yaml.compose recurses: 5,000-deep YAML would blow Python's stack
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        column = "" if mark is None else f" at column {mark.column + 1}"
        raise RulesError(
            f.name, line, f.stem, f"invalid YAML{column}: {exc.problem or exc.context}"
        ) from None
    except yaml.YAMLError as exc:
        raise RulesError(f.name, None, f.stem, f"invalid YAML: {exc}") from None
    if root is None:
        raise RulesError(f.name, 1, f.stem, "empty file; expected a mapping")
    return f, root


# ---------------------------------------------------------------- one function per file


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
        tm = f.mapping(m["timing"], "gates.timing", ("max_self_report_gap",))
        timing = TimingGate(f.fraction(tm["max_self_report_gap"], "gates.timing.max_self_report_gap"))
    audit = DecodeAuditGate()
    if "decode_audit" in m:
        da = f.mapping(m["decode_audit"], "gates.decode_audit",
                       ("top1_min", "near_tie", "share", "min_requests", "self_top1_min", "self_drop_max"))
        audit = DecodeAuditGate(
            top1_min=f.fraction(da["top1_min"], "gates.decode_audit.top1_min"),
            near_tie=f.number(da["near_tie"], "gates.decode_audit.near_tie", 0, None),
            share=f.ratio(da["share"], "gates.decode_audit.share"),
            min_requests=f.integer(da["min_requests"], "gates.decode_audit.min_requests"),
            self_top1_min=f.fraction(da["self_top1_min"], "gates.decode_audit.self_top1_min"),
            self_drop_max=f.fraction(da["self_drop_max"], "gates.decode_audit.self_drop_max"),
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
            ar_speed_min_ratio=f.ratio(
                sp["ar_speed_min_ratio"], "gates.spec.ar_speed_min_ratio"
            ),
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
        m = f.mapping(node, field, ("device", "contexts", "measurement", *(("quiet",) if "quiet" in present else ())))
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


_OPTIONAL_MEASUREMENT = ("run_timeout_s", "max_output_mb", "pairs_per_block", "min_blocks")


def _measurement(f: _File, node: yaml.Node, field: str) -> Measurement:
    keys = [fl.name for fl in fields(Measurement)]
    present = {key for key, _, _ in f.items(node, field)}
    m = f.mapping(node, field, [k for k in keys if k not in _OPTIONAL_MEASUREMENT or k in present])
    optional = {
        k: f.integer(m[k], f"{field}.{k}", minimum=1) for k in _OPTIONAL_MEASUREMENT if k in m
    }
    min_pairs = f.integer(m["min_pairs"], f"{field}.min_pairs", minimum=2)  # one pair has no spread
    max_pairs = f.integer(m["max_pairs"], f"{field}.max_pairs", minimum=2)
    if max_pairs < min_pairs:
        f.fail(
            m["max_pairs"],
            f"{field}.max_pairs",
            f"expected at least min_pairs ({min_pairs}), got {max_pairs}",
        )
    return Measurement(
        decode_tokens=f.integer(m["decode_tokens"], f"{field}.decode_tokens"),
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
    f.fail(node, field, "expected a mapping with 'registry' and 'sha256', or with 'shape' alone")


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


def _copycat(f: _File, root: yaml.Node) -> Copycat:
    keys = ("containment", "warnings_to_block", "tiny_pr", "boilerplate_max_prs", "winnowing", "strikes")
    m = f.mapping(root, "copycat", keys)
    c = f.mapping(m["containment"], "copycat.containment", ("block", "warn"))
    block = f.fraction(c["block"], "copycat.containment.block")
    warn = f.fraction(c["warn"], "copycat.containment.warn")
    if warn >= block:
        f.fail(
            c["warn"],
            "copycat.containment.warn",
            f"expected a number below containment.block ({block:g}), got {warn:g}",
        )
    tiny = f.mapping(m["tiny_pr"], "copycat.tiny_pr", ("below_added_lines", "warn_literal_overlap"))
    win = f.mapping(m["winnowing"], "copycat.winnowing", ("k", "w"))
    strikes = f.mapping(m["strikes"], "copycat.strikes", ("limit", "window_days"))
    return Copycat(
        containment=Containment(block, warn),
        warnings_to_block=f.integer(m["warnings_to_block"], "copycat.warnings_to_block"),
        tiny_pr=TinyPr(
            f.integer(tiny["below_added_lines"], "copycat.tiny_pr.below_added_lines"),
            f.fraction(tiny["warn_literal_overlap"], "copycat.tiny_pr.warn_literal_overlap"),
        ),
        boilerplate_max_prs=f.integer(m["boilerplate_max_prs"], "copycat.boilerplate_max_prs"),
        winnowing=Winnowing(
            f.integer(win["k"], "copycat.winnowing.k"), f.integer(win["w"], "copycat.winnowing.w")
        ),
        strikes=Strikes(
            f.integer(strikes["limit"], "copycat.strikes.limit"),
            f.integer(strikes["window_days"], "copycat.strikes.window_days"),
        ),
    )


def _policy(f: _File, root: yaml.Node, labels_in_use: dict[str, str]) -> Policy:
    present = {key for key, _, _ in f.items(root, "policy")}
    keys = ("open_pr_cap", "areas", "sensitive_paths", "blocklist", "stale", "template",
            *(("harness_modules",) if "harness_modules" in present else ()))
    m = f.mapping(root, "policy", keys)
    areas = []
    for label, key_node, node in f.items(m["areas"], "policy.areas"):
        field = _join("policy.areas", label)
        f.label(key_node, field)
        if label in labels_in_use:
            f.fail(
                key_node,
                field,
                f"expected a label not used elsewhere, got {label!r} (already {labels_in_use[label]})",
            )
        a = f.mapping(node, field, ("weight", "paths"))
        paths = tuple(
            f.path_pattern(p, _join(f"{field}.paths", i))
            for i, p in enumerate(f.sequence(a["paths"], f"{field}.paths"))
        )
        if not paths:
            f.fail(a["paths"], f"{field}.paths", "expected at least one path, got none")
        areas.append(Area(label, f.fraction(a["weight"], f"{field}.weight"), paths))
    if not areas:
        f.fail(m["areas"], "policy.areas", "expected at least one area, got none")
    total = sum(a.weight for a in areas)
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        f.fail(m["areas"], "policy.areas", f"expected weights summing to 1, got {total:g}")
    sensitive = f.sequence(m["sensitive_paths"], "policy.sensitive_paths")
    logins = []
    for i, node in enumerate(f.sequence(m["blocklist"], "policy.blocklist")):
        login = f.text(node, _join("policy.blocklist", i), _LOGIN, "a GitHub login")
        if login.casefold() in (x.casefold() for x in logins):
            f.fail(node, _join("policy.blocklist", i), f"expected each login once, got {login!r} again")
        logins.append(login)
    st = f.mapping(m["stale"], "policy.stale", ("days_without_push", "max_fruitless_verdicts"))
    tp = f.mapping(m["template"], "policy.template", ("require_benchmark", "claim_gap_max"))
    return Policy(
        open_pr_cap=f.integer(m["open_pr_cap"], "policy.open_pr_cap"),
        areas=tuple(areas),
        sensitive_paths=tuple(
            f.path_pattern(p, _join("policy.sensitive_paths", i)) for i, p in enumerate(sensitive)
        ),
        blocklist=tuple(logins),
        harness_modules=tuple(
            f.text(n, _join("policy.harness_modules", i), _MODULE, "a dotted module name such as engine.cli")
            for i, n in enumerate(f.sequence(m["harness_modules"], "policy.harness_modules"))
        ) if "harness_modules" in m else (),
        stale=Stale(
            days_without_push=f.integer(st["days_without_push"], "policy.stale.days_without_push"),
            max_fruitless_verdicts=f.integer(
                st["max_fruitless_verdicts"], "policy.stale.max_fruitless_verdicts", minimum=0
            ),
        ),
        template=Template(
            require_benchmark=f.boolean(tp["require_benchmark"], "policy.template.require_benchmark"),
            # Above 0: a zero tolerance would flag every claim made on a contributor's own machine.
            claim_gap_max=f.number(tp["claim_gap_max"], "policy.template.claim_gap_max", 0, 1, lo_open=True),
        ),
    )


def _automerge(f: _File, root: yaml.Node, tiers: tuple[Tier, ...], known_labels: dict[str, str]) -> Automerge:
    present = {key for key, _, _ in f.items(root, "automerge")}
    optional = [k for k in ("required_ci_workflow", "approval_paths", "approval_label") if k in present]
    m = f.mapping(root, "automerge", ("enabled", "min_tier", "required_labels", "blocking_labels", *optional))
    names = sorted(known_labels)

    def refs(key: str) -> tuple[str, ...]:
        field = f"automerge.{key}"
        return tuple(
            f.choice(n, _join(field, i), names, "a label defined in labels.yaml or policy.yaml")
            for i, n in enumerate(f.sequence(m[key], field))
        )

    required, blocking = refs("required_labels"), refs("blocking_labels")
    for i, name in enumerate(blocking):
        if name in required:
            node = m["blocking_labels"].value[i]
            f.fail(
                node,
                _join("automerge.blocking_labels", i),
                f"expected a label not in required_labels, got {name!r}",
            )
    approval_paths = tuple(
        f.path_pattern(n, _join("automerge.approval_paths", i))
        for i, n in enumerate(f.sequence(m["approval_paths"], "automerge.approval_paths"))
    ) if "approval_paths" in m else ()
    approval_label = f.label(m["approval_label"], "automerge.approval_label") if "approval_label" in m else None
    if approval_paths and approval_label is None:
        f.fail(m["approval_paths"], "automerge.approval_label", "missing; approval_paths needs the label that approves")
    workflow = None
    if "required_ci_workflow" in m:
        workflow = f.text(m["required_ci_workflow"], "automerge.required_ci_workflow", _WORKFLOW_FILE,
                          "a workflow file name such as ci.yml")
    return Automerge(
        enabled=f.boolean(m["enabled"], "automerge.enabled"),
        min_tier=f.choice(m["min_tier"], "automerge.min_tier", [t.name for t in tiers], "a tier"),
        required_labels=required,
        blocking_labels=blocking,
        required_ci_workflow=workflow,
        approval_paths=approval_paths,
        approval_label=approval_label,
    )


_OPTIONAL_DISPATCH = ("workflow", "ref", "timeout_minutes", "max_attempts")
_WORKFLOW_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.ya?ml")
_GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def _dispatch(f: _File, root: yaml.Node) -> Dispatch:
    allowed = ("mode", "runner_public_keys", *_OPTIONAL_DISPATCH)
    present: set[str] = set()
    for key, key_node, _ in f.items(root, "dispatch"):
        if key not in allowed:  # checked here so that a misspelt optional key still gets its hint
            hint = _did_you_mean(key, allowed)
            f.fail(
                key_node, _join("dispatch", key), f"unknown key{hint}; expected one of: {', '.join(allowed)}"
            )
        present.add(key)
    m = f.mapping(root, "dispatch", [k for k in allowed if k not in _OPTIONAL_DISPATCH or k in present])
    extra: dict[str, Any] = {}
    if "workflow" in m:
        what = "a workflow file name in .github/workflows (e.g. evalbot-eval.yml)"
        extra["workflow"] = f.text(m["workflow"], "dispatch.workflow", _WORKFLOW_FILE, what)
    if "ref" in m:
        extra["ref"] = f.text(m["ref"], "dispatch.ref", _GIT_REF, "a branch or tag name")
    for key in ("timeout_minutes", "max_attempts"):
        if key in m:
            extra[key] = f.integer(m[key], f"dispatch.{key}")
    mode = f.choice(m["mode"], "dispatch.mode", DISPATCH_MODES, "a dispatch mode")
    what = "an Ed25519 public key (base64 of 32 raw bytes)"
    keys = []
    for i, node in enumerate(f.sequence(m["runner_public_keys"], "dispatch.runner_public_keys")):
        field = _join("dispatch.runner_public_keys", i)
        text = f.text(node, field, what=what)
        try:
            raw = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raw = b""
        if len(raw) != 32:
            f.fail(node, field, f"expected {what}, got {text!r}")
        keys.append(text)
    if mode == "actions" and not keys:
        # Results from remote runners are trusted only when signed by a key listed here.
        f.fail(
            m["runner_public_keys"],
            "dispatch.runner_public_keys",
            "expected at least one key when mode is 'actions', got none",
        )
    return Dispatch(mode, tuple(keys), **extra)
