"""The conformance kit of `evalbot.serve/1` (docs/protocol.md): every requirement the harness holds a
serving engine to, run against one engine, each a pass or a fail with its reason (`evalbot engine check`).

The kit talks to the engine through the harness's own `ServedProcess`, so an engine that passes here is
read by the judge the same way: the same ready check, the same line reader, the same token and count
checks. A requirement that breaks the process (a crash, a timeout) fails, and the next one starts a fresh
process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evalbot.evaluate.serve_error import ServeError
from evalbot.evaluate.served import ServedProcess

LABEL = "engine"  # the label the kit's processes carry
QUIET_S = 1.0  # how long the kit listens for a line nobody asked for, after the ready line
GEN = 8  # tokens per generate request
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


@dataclass(frozen=True)
class Outcome:
    """One requirement's result: its id, what it asks, and why it failed (None: it passed)."""

    id: str
    requirement: str
    failure: str | None
    skipped: str | None = None  # why it does not apply to this engine

    @property
    def passed(self) -> bool:
        return self.failure is None

    def line(self) -> str:
        mark = "FAIL" if self.failure else ("SKIP" if self.skipped else "PASS")
        why = self.failure or self.skipped
        return f"{mark}  {self.id:<22} {self.requirement}" + (f": {why}" if why else "")


class Skip(Exception):
    """A requirement that does not apply to this engine (an op it does not list)."""


Start = Callable[[], ServedProcess]


class Kit:
    """Runs the requirements in order against processes from `start`, a fresh one whenever the last broke."""

    def __init__(self, start: Start, timeout_s: float):
        self.start, self.timeout_s = start, timeout_s
        self.proc: ServedProcess | None = None

    def process(self) -> ServedProcess:
        """A ready process (ServeError where none comes up)."""
        if self.proc is not None and not self.proc.broken and self.proc.proc.poll() is None:
            return self.proc
        self.close()
        self.proc = self.start()
        self.proc.wait_ready(self.timeout_s)
        return self.proc

    def ask(self, body: dict[str, Any]) -> Any:
        return self.process().request(body, self.timeout_s)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None


# ---------------------------------------------------------------- the requirements


def _ready(kit: Kit) -> None:
    kit.process()


def _config(kit: Kit) -> None:
    ready = kit.process().ready
    ops = ready.get("ops")
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ServeError(f"the ready line's ops is not a list of op names: {json.dumps(ops)[:120]}")
    if "generate" not in ops:
        raise ServeError(f"the ready line's ops do not list generate: {ops}")


def _quiet(kit: Kit) -> None:
    p = kit.process()
    line = p.next_line(time.monotonic() + QUIET_S + 1, QUIET_S, until=time.monotonic() + QUIET_S)
    if line is not None:
        p.broken = True
        raise ServeError(f"a line came with no request asked: {json.dumps(line.obj)[:160]}")


def _token_stream(kit: Kit) -> None:
    t = kit.ask({"op": "generate", "prompt_ids": PROMPT, "max_new": GEN})
    if len(t.tokens) != GEN or any(len(s) != 1 for s in t.steps):
        raise ServeError(f"asked for {GEN} tokens one a line, got {[len(s) for s in t.steps]} tokens a line")


def _ends_stream(kit: Kit) -> None:
    t = kit.ask({"op": "generate", "prompt_ids": PROMPT, "max_new": GEN, "stream": "ends"})
    shape = [len(s) for s in t.steps]
    if shape != [1, GEN - 1]:
        raise ServeError(
            f"asked for the first token, then the other {GEN - 1} in one line; got lines of {shape}"
        )


def _vocabulary(kit: Kit) -> None:
    # the reader already refuses a token outside the ready line's vocab_size; a longer request looks harder
    t = kit.ask({"op": "generate", "prompt_ids": PROMPT[::-1], "max_new": 4 * GEN})
    bad = [x for x in t.tokens if not 0 <= x < kit.process().vocab]
    if bad:
        raise ServeError(f"tokens outside the vocabulary of {kit.process().vocab}: {bad[:5]}")


def _greedy(kit: Kit) -> None:
    body = {"op": "generate", "prompt_ids": PROMPT, "max_new": GEN}
    a, b = kit.ask(body).tokens, kit.ask(body).tokens
    if a != b:
        raise ServeError(f"the same greedy request answered {list(a)} then {list(b)}")


def _two_part(kit: Kit) -> None:
    if "prefill" not in (kit.process().ready.get("ops") or []):
        raise Skip("the ready line lists no prefill op: the judge times requests in one part")
    one = kit.ask({"op": "generate", "prompt_ids": [*PROMPT, 5], "max_new": GEN}).tokens
    pre = kit.ask({"op": "prefill", "prompt_ids": PROMPT})
    if pre.tokens:
        raise ServeError(f"a prefill answered {len(pre.tokens)} tokens; it must answer none")
    two = kit.ask({"op": "generate", "continue": True, "prompt_ids": [5], "max_new": GEN, "stream": "ends"})
    if list(two.tokens) != list(one):
        raise ServeError(f"the prefilled prompt continued by [5] decoded {list(two.tokens)}, the whole prompt "
                         f"in one request {list(one)}")  # fmt: skip


def _malformed(kit: Kit) -> None:
    p = kit.process()
    assert p.proc.stdin is not None
    p.proc.stdin.write(b'{"id": "x1", "op": "no-such-op"}\n')
    p.proc.stdin.flush()
    line = p.next_line(time.monotonic() + kit.timeout_s, kit.timeout_s)
    assert line is not None
    if line.obj.get("id") != "x1" or line.obj.get("event") != "error":
        raise ServeError(f"an unknown op got {json.dumps(line.obj)[:160]}, not an error event for its id")
    _token_stream(kit)  # and it goes on serving


def _alive(kit: Kit) -> None:
    p = kit.process()
    if p.proc.poll() is not None:
        raise ServeError(f"the engine exited ({p.proc.returncode}) while it had requests to answer")


def _shutdown(kit: Kit) -> None:
    p = kit.process()
    assert p.proc.stdin is not None
    p.proc.stdin.write(b'{"op": "shutdown"}\n')
    p.proc.stdin.flush()
    try:
        code = p.proc.wait(timeout=30)
    except Exception as exc:
        raise ServeError("the engine did not exit within 30 s of a shutdown request") from exc
    kit.proc = None
    p.close()
    if code != 0:
        raise ServeError(f"the engine exited with status {code} after a shutdown request")


REQUIREMENTS: tuple[tuple[str, str, Callable[[Kit], None]], ...] = (
    ("ready", "its first line is the ready line of the declared protocol", _ready),
    (
        "ready-config",
        "the ready line names its vocab_size and the ops it answers (generate at least)",
        _config,
    ),
    ("nothing-unasked", "after the ready line, no line comes until a request asks for one", _quiet),
    ("generate-token-stream", "a generate streams one token a line, then its summary", _token_stream),
    ("generate-ends-stream", "with stream 'ends': the first token, then the rest in one line", _ends_stream),
    ("tokens-in-vocabulary", "every token lies within the vocab_size of its ready line", _vocabulary),
    ("greedy-deterministic", "the same greedy request answers the same tokens", _greedy),
    (
        "two-part-request",
        "a prefill answers no token; its continuation decodes as the whole prompt",
        _two_part,
    ),
    ("malformed-request", "an unknown op gets an error event for its id, and serving goes on", _malformed),
    ("alive-after-ready", "the engine does not exit while it is being asked", _alive),
    ("shutdown", "a shutdown request ends it with status 0", _shutdown),
)


def check(start: Start, timeout_s: float = 120.0) -> list[Outcome]:
    """Every requirement against engines from `start`, in order."""
    kit = Kit(start, timeout_s)
    out = []
    try:
        for rid, what, run in REQUIREMENTS:
            try:
                run(kit)
                out.append(Outcome(rid, what, None))
            except Skip as skip:
                out.append(Outcome(rid, what, None, skipped=str(skip)))
            except ServeError as exc:
                if kit.proc is not None:
                    kit.proc.broken = True
                out.append(Outcome(rid, what, _reason(exc)))
    finally:
        kit.close()
    return out


def _reason(exc: ServeError) -> str:
    """The error without the process's label, with the last line the engine wrote on stderr."""
    text = str(exc).removeprefix(f"{LABEL}: ")
    tail = exc.tail.strip().splitlines()[-1:] if exc.tail else []
    return text + (f" (its stderr ends: {tail[0][:160]})" if tail else "")
