"""Check an engine's JSON record: it comes from untrusted code, so every field is doubted.

A record is one JSON object on stdout (see the engine–bot protocol in DESIGN.md). NaN, infinities,
negative or physically impossible throughputs, and fields that disagree with each other are rejected
with a reason that names the field.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from typing import Any

SCHEMA_VERSION = 1
COMMANDS = ("bench", "score", "spec", "generate")
# Far above any real engine on any real GPU: a number past these is a bug or a lie, not a speedup.
MAX_DECODE_TPS = 1e6
MAX_PREFILL_TPS = 1e8
_REL_TOL = 1e-6

_SHA256 = re.compile(r"[0-9a-f]{64}")


MAX_PROBLEMS_SHOWN = 10  # a record with 5,000 bad fields must not make a 500k-character message


class RecordError(ValueError):
    """An engine record could not be parsed or is invalid; problems lists every reason."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


def parse_record(stdout: str, command: str) -> dict[str, Any]:
    """The one JSON object on stdout (blank lines ignored); RecordError otherwise."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise RecordError(f"`{command}` printed nothing on stdout; expected one JSON record")
    if len(lines) > 1:
        n_json = sum(1 for line in lines if _is_json(line))
        what = f"{n_json} JSON lines" if n_json > 1 else f"{len(lines)} non-blank lines"
        raise RecordError(f"stdout held {what}; expected exactly one JSON record (first: {_clip(lines[0])})")
    try:
        record = _loads(lines[0])
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON ({exc}): {_clip(lines[0])}") from None
    if not isinstance(record, dict):
        raise RecordError(f"the record is a JSON {type(record).__name__}, not an object: {_clip(lines[0])}")
    return record


def validate(record: dict[str, Any], command: str) -> list[str]:
    """Every problem with a parsed record for command; an empty list means it is valid."""
    if command not in COMMANDS:
        raise ValueError(f"unknown engine command {command!r} (known: {', '.join(COMMANDS)})")
    c = _Checker(record)
    expected = f"evalbot.engine.{command}/{SCHEMA_VERSION}"
    if c.require("schema", str) and record["schema"] != expected:
        c.problem(f"schema is {_clip(record['schema'], 80)}, expected {expected!r}")
    if c.require("command", str) and record["command"] != command:
        c.problem(f"command is {_clip(record['command'], 80)}, expected {command!r}")
    c.require("engine", str)
    if c.require("model_sha256", str) and not _SHA256.fullmatch(record["model_sha256"]):
        c.problem(f"model_sha256 is not 64 lowercase hex digits: {_clip(record['model_sha256'], 80)}")
    if c.require("device", str) and not record["device"]:
        c.problem("device is empty")
    c.require("config", dict)
    if c.require("timings", dict):
        for k, v in record["timings"].items():
            c.number(f"timings.{k}", v, minimum=0.0)
    if c.require("counts", dict):
        for k, v in record["counts"].items():
            if not _is_int(v) or v < 0:
                c.problem(f"counts.{k} must be a non-negative integer, got {_show(v)}")
    _CHECKS[command](c, record)
    return c.problems


def parse_and_validate(stdout: str, command: str) -> dict[str, Any]:
    """The validated record from an engine's stdout; RecordError listing every problem otherwise."""
    record = parse_record(stdout, command)
    problems = validate(record, command)
    if problems:
        shown = [p if len(p) <= 300 else p[:299] + "…" for p in problems[:MAX_PROBLEMS_SHOWN]]
        more = len(problems) - len(shown)
        raise RecordError(
            "; ".join(shown) + (f"; and {more} more problems" if more > 0 else ""), tuple(problems)
        )
    return record


# ---------------------------------------------------------------- per command


def _bench(c: _Checker, r: dict[str, Any]) -> None:
    runs = c.count("runs", minimum=1)
    for name, bound in (("prefill_tps", MAX_PREFILL_TPS), ("decode_tps", MAX_DECODE_TPS)):
        c.number(name, above=0.0, maximum=bound)
        values = c.number_list(f"{name}_runs", runs, "counts.runs", above=0.0, maximum=bound)
        if values and c.ok(name) and not _close(r[name], statistics.median(values)):
            c.problem(f"{name} {r[name]!r} is not the median of {name}_runs ({statistics.median(values)!r})")


def _score(c: _Checker, r: dict[str, Any]) -> None:
    positions = c.count("positions", minimum=1)
    n_vocab = c.count("n_vocab", minimum=1)
    c.require("path", str)
    c.int_list(
        "token_ids", None if positions is None else positions + 1, "counts.positions + 1", below=n_vocab
    )
    c.int_list("argmax", positions, "counts.positions", below=n_vocab)
    nll = c.number_list("nll", positions, "counts.positions", minimum=0.0)
    if c.number("mean_nll", minimum=0.0) and nll and not _close(r["mean_nll"], math.fsum(nll) / len(nll)):
        c.problem(
            f"mean_nll {r['mean_nll']!r} is not the mean of nll ({math.fsum(nll) / len(nll)!r})", "mean_nll"
        )
    if c.number("ppl", minimum=1.0) and c.ok("mean_nll"):
        try:
            expected = math.exp(r["mean_nll"])
        except OverflowError:
            c.problem(f"mean_nll {r['mean_nll']!r} is too large to be a perplexity's log")
        else:
            if not _close(r["ppl"], expected):
                c.problem(f"ppl {r['ppl']!r} is not exp(mean_nll) = {expected!r}")


def _spec(c: _Checker, r: dict[str, Any]) -> None:
    runs = c.count("runs", minimum=1)
    steps = c.count("verify_steps", minimum=1, required=False)
    for name in ("ar_tps", "spec_tps"):
        c.number(name, above=0.0, maximum=MAX_DECODE_TPS)
        if f"{name}_runs" in r:
            c.number_list(f"{name}_runs", runs, "counts.runs", above=0.0, maximum=MAX_DECODE_TPS)
    block = None
    if c.require("block_size", int):
        if r["block_size"] < 1:
            c.problem(f"block_size must be at least 1, got {r['block_size']}")
        else:
            block = r["block_size"]
    if c.number("mean_accept", minimum=1.0) and block is not None and r["mean_accept"] > block:
        c.problem(f"mean_accept {r['mean_accept']!r} exceeds block_size {block}", "mean_accept")
    if c.require("accept_hist", dict) and block is not None:
        _accept_hist(c, r, block, steps)
    if c.present("lossless") and r["lossless"] not in (0, 1, None):  # true/false equal 1/0: fine for a flag
        c.problem(f"lossless must be 0, 1 or null, got {_show(r['lossless'])}")
    if c.present("lossless_runs") and (lr := r["lossless_runs"]) is not None:
        if not _is_int(lr) or lr < 0:
            c.problem(f"lossless_runs must be a non-negative integer or null, got {_show(lr)}")
        elif runs is not None and lr > runs:
            c.problem(f"lossless_runs {lr} exceeds counts.runs {runs}")
    if "lossless" in r and "lossless_runs" in r and (r["lossless"] is None) != (r["lossless_runs"] is None):
        c.problem("lossless and lossless_runs must both be null (sampled decoding) or both be set")
    divergence = r.get("first_divergence")
    if divergence is not None and (not _is_int(divergence) or divergence < 0):
        c.problem(f"first_divergence must be a non-negative integer or null, got {_show(divergence)}")


def _accept_hist(c: _Checker, r: dict[str, Any], block: int, steps: int | None) -> None:
    hist = r["accept_hist"]
    if set(hist) != {str(k) for k in range(1, block + 1)}:
        c.problem(f"accept_hist keys must be '1'..'{block}', got {_clip(sorted(hist), 120)}")
        return
    bad = next((k for k, v in hist.items() if not _is_int(v) or v < 0), None)
    if bad is not None:
        c.problem(f"accept_hist[{bad!r}] must be a non-negative integer, got {_show(hist[bad])}")
        return
    total = sum(hist.values())
    if steps is not None and total != steps:
        c.problem(f"accept_hist counts {total} verify steps, counts.verify_steps says {steps}")
    if total and c.ok("mean_accept"):
        mean = sum(int(k) * v for k, v in hist.items()) / total
        if not _close(r["mean_accept"], mean):
            c.problem(f"mean_accept {r['mean_accept']!r} disagrees with accept_hist (mean {mean!r})")


def _generate(c: _Checker, r: dict[str, Any]) -> None:
    c.int_list("token_ids", c.count("new_tokens", required=False), "counts.new_tokens")
    c.require("text", str)
    for name, bound in (("prefill_tps", MAX_PREFILL_TPS), ("decode_tps", MAX_DECODE_TPS)):
        if name in r:  # 0.0 is honest here: a one-token generation has no decode steps to time
            c.number(name, minimum=0.0, maximum=bound)


_CHECKS: dict[str, Callable[[_Checker, dict[str, Any]], None]] = {
    "bench": _bench,
    "score": _score,
    "spec": _spec,
    "generate": _generate,
}


# ---------------------------------------------------------------- field checks

_MISSING = object()
_KIND = {str: "string", int: "integer", dict: "JSON object", list: "JSON array"}


class _Checker:
    """Collects problems; each check says whether its field passed, so later checks can build on it."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.problems: list[str] = []
        self._bad: set[str] = set()

    def problem(self, message: str, name: str | None = None) -> None:
        self.problems.append(message)
        if name:
            self._bad.add(name)

    def ok(self, name: str) -> bool:
        return name in self.record and name not in self._bad

    def present(self, name: str) -> bool:
        if name in self.record:
            return True
        self.problem(f"missing field {name!r}", name)
        return False

    def require(self, name: str, kind: type) -> bool:
        if not self.present(name):
            return False
        value = self.record[name]
        if not (_is_int(value) if kind is int else isinstance(value, kind)):
            self.problem(f"{name} must be a {_KIND[kind]}, got {_show(value)}", name)
            return False
        return True

    def number(
        self,
        name: str,
        value: Any = _MISSING,
        *,
        minimum: float | None = None,
        above: float | None = None,
        maximum: float | None = None,
    ) -> bool:
        """Check a number: the record's field `name`, or value (labelled name) when given."""
        if value is _MISSING:
            if not self.present(name):
                return False
            value = self.record[name]
        if not _is_number(value):
            self.problem(f"{name} must be a number, got {_show(value)}", name)
        elif not math.isfinite(value):
            self.problem(f"{name} must be finite, got {value!r}", name)
        elif minimum is not None and value < minimum:
            self.problem(f"{name} must be >= {minimum:g}, got {value!r}", name)
        elif above is not None and value <= above:
            self.problem(f"{name} must be > {above:g}, got {value!r}", name)
        elif maximum is not None and value >= maximum:
            self.problem(f"{name} {value!r} is impossibly high (limit {maximum:g})", name)
        else:
            return True
        return False

    def count(self, name: str, *, minimum: int = 0, required: bool = True) -> int | None:
        counts = self.record.get("counts")
        if not isinstance(counts, dict):
            return None  # already reported
        if name not in counts:
            if required:
                self.problem(f"missing field 'counts.{name}'")
            return None
        value = counts[name]
        if not _is_int(value) or value < minimum:
            if _is_int(value) and value >= 0:  # other bad values were reported with the other counts
                self.problem(f"counts.{name} must be at least {minimum}, got {value}")
            return None
        return value

    def number_list(
        self, name: str, length: int | None, length_name: str, **bounds: float
    ) -> list[float] | None:
        if not self.require(name, list):
            return None
        values = self.record[name]
        if length is not None and len(values) != length:
            self.problem(f"{name} has {len(values)} entries but {length_name} is {length}", name)
            return None
        for i, v in enumerate(values):
            if not self.number(f"{name}[{i}]", v, **bounds):
                return None  # one bad entry rejects the list; don't list thousands
        return values

    def int_list(
        self, name: str, length: int | None, length_name: str, below: int | None = None
    ) -> list[int] | None:
        if not self.require(name, list):
            return None
        values = self.record[name]
        bad = next((i for i, v in enumerate(values) if not _is_int(v) or v < 0), None)
        if bad is not None:
            self.problem(f"{name}[{bad}] must be a non-negative integer, got {_show(values[bad])}", name)
        elif length is not None and len(values) != length:
            self.problem(f"{name} has {len(values)} entries but {length_name} is {length}", name)
        elif below is not None and values and max(values) >= below:
            self.problem(
                f"{name} holds {max(values)}, outside the vocabulary of {below} (counts.n_vocab)", name
            )
        else:
            return values
        return None


# ---------------------------------------------------------------- helpers


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)  # JSON true is not a number


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-12)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf without ever spelling "Infinity"
        raise ValueError(f"{text} overflows to {value}")
    return value


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _is_json(text: str) -> bool:
    try:
        _loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _clip(value: Any, n: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:n] + ("…" if len(text) > n else ""))


def _show(value: Any) -> str:
    if value is None:
        return "null"
    kind = "bool" if isinstance(value, bool) else type(value).__name__
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
    return f"{kind} {text[:60]}{'…' if len(text) > 60 else ''}"
