"""How a block's two serving processes start: one after the other, or both at once (`measurement.start`).

What must hold either way: the side named first launches first (the crossover alternates it), neither side
is timed or asked anything before both are ready and frozen, a side that fails to start is that side's
failure (never the other's), and a failed start leaves no process running. The first tests' processes
are stand-ins that record what was done to them; the last two start real processes whose loads can only
finish together, so that a "parallel" start that in fact loads one after the other fails.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evalbot.evaluate import abtest, sandbox, served
from evalbot.evaluate.served import ServeError
from evalbot.model import Side


@dataclass
class Proc:
    label: str
    events: list[str]
    fail: bool = False
    vocab: int = 100
    ready: dict = field(default_factory=dict)

    def wait_ready(self, timeout_s: float) -> dict:
        self.events.append(f"ready {self.label}")
        if self.fail:
            raise ServeError(f"{self.label}: exited 1 before its ready line", "Traceback ...", stage="start")
        return self.ready

    def freeze(self) -> int:
        self.events.append(f"freeze {self.label}")
        return 0

    def close(self) -> None:
        self.events.append(f"close {self.label}")


def _launcher(events: list[str], failing: Side | None = None, vocab: dict[Side, int] | None = None):
    def launch(side: Side) -> Proc:
        events.append(f"launch {side.value}")
        return Proc(side.value, events, side is failing, (vocab or {}).get(side, 100))

    return launch


@pytest.mark.parametrize("base_first", [True, False])
def test_serial_start_launches_the_second_once_the_first_is_ready(base_first):
    events: list[str] = []
    procs = abtest._start_block(_launcher(events), 10, lambda _m: None, base_first, parallel=False)
    a, b = ("base", "head") if base_first else ("head", "base")
    assert events == [f"launch {a}", f"ready {a}", f"launch {b}", f"ready {b}", f"freeze {a}", f"freeze {b}"]
    assert set(procs) == {Side.BASE, Side.HEAD}


@pytest.mark.parametrize("base_first", [True, False])
def test_parallel_start_launches_both_before_waiting_and_keeps_the_crossover_s_order(base_first):
    events: list[str] = []
    logged: list[str] = []
    procs = abtest._start_block(_launcher(events), 10, logged.append, base_first, parallel=True)
    a, b = ("base", "head") if base_first else ("head", "base")
    assert events == [f"launch {a}", f"launch {b}", f"ready {a}", f"ready {b}", f"freeze {a}", f"freeze {b}"]
    assert [m.split("'")[0] for m in logged] == [a, b] and all("ready in" in m for m in logged)
    assert set(procs) == {Side.BASE, Side.HEAD}


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("failing", [Side.BASE, Side.HEAD])
def test_a_side_that_fails_to_start_is_that_side_s_failure_and_nothing_is_left_running(parallel, failing):
    events: list[str] = []
    with pytest.raises(abtest.SideError) as info:
        abtest._start_block(_launcher(events, failing), 10, lambda _m: None, True, parallel=parallel)
    assert info.value.side is failing and "did not start" in str(info.value)
    launched = {e.split()[1] for e in events if e.startswith("launch")}
    closed = {e.split()[1] for e in events if e.startswith("close")}
    assert launched == closed  # whatever was launched was ended
    assert not any(e.startswith("freeze") for e in events)
    if parallel:
        assert launched == {"base", "head"}  # both were loading when one failed: both ended


@pytest.mark.parametrize("parallel", [False, True])
def test_a_head_naming_another_vocabulary_is_the_head_s_failure_either_way(parallel):
    events: list[str] = []
    launch = _launcher(events, vocab={Side.HEAD: 10**9})
    with pytest.raises(abtest.SideError) as info:
        abtest._start_block(launch, 10, lambda _m: None, False, parallel=parallel)
    assert info.value.side is Side.HEAD and "vocabulary" in str(info.value)
    assert sorted(e for e in events if e.startswith("close")) == ["close base", "close head"]


# ------------------------------------------------------------------ real processes


def _meeting_server(tmp: Path, me: str, other: str, wait_s: float = 20) -> served.ServedProcess:
    """A stand-in whose "load" ends only once the other side's load has begun (each leaves a marker and
    waits up to `wait_s` for the other's): it reaches its ready line only if both load at once."""
    script = textwrap.dedent(f"""
        import json, sys, time, pathlib
        here, there = pathlib.Path({str(tmp / me)!r}), pathlib.Path({str(tmp / other)!r})
        here.touch()
        deadline = time.monotonic() + {wait_s}
        while not there.exists():
            if time.monotonic() > deadline:
                sys.exit("loaded alone")
            time.sleep(0.01)
        sys.stdout.write(json.dumps({{"event": "ready", "protocol": "evalbot.serve/1",
                                      "config": {{"vocab_size": 100}}}}) + "\\n")
        sys.stdout.flush()
        for line in sys.stdin:
            if json.loads(line).get("op") == "shutdown":
                break
    """)
    path = tmp / f"{me}.py"
    path.write_text(script)
    spec = sandbox.SandboxSpec(
        ro_binds=(),
        scratch=tmp,
        workdir=tmp,
        env={"PATH": os.environ["PATH"]},
        limits=sandbox.Limits(timeout_s=60),
    )
    return served.ServedProcess.start(me, spec, [sys.executable, str(path)], no_sandbox=True)


def _state(pid: int) -> str:
    """The process's state letter, once a signal sent to it has had time to land (up to 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T" or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_real_processes_started_in_parallel_load_at_once_and_are_frozen_once_both_are_ready(tmp_path):
    def launch(side: Side) -> served.ServedProcess:
        other = Side.HEAD if side is Side.BASE else Side.BASE
        return _meeting_server(tmp_path, side.value, other.value)

    procs = abtest._start_block(launch, 30, lambda _m: None, False, parallel=True)
    try:
        assert {s: _state(p.proc.pid) for s, p in procs.items()} == {Side.BASE: "T", Side.HEAD: "T"}
    finally:
        abtest._close(procs)
    assert all(p.proc.poll() is not None for p in procs.values())  # closed: nothing left running


def test_the_same_processes_started_serially_never_meet_and_the_first_is_blamed(tmp_path):
    def launch(side: Side) -> served.ServedProcess:
        other = Side.HEAD if side is Side.BASE else Side.BASE
        return _meeting_server(tmp_path, side.value, other.value, wait_s=2)

    with pytest.raises(abtest.SideError) as info:  # the first never sees the second begin: 2 s, then exit
        abtest._start_block(launch, 30, lambda _m: None, True, parallel=False)
    assert info.value.side is Side.BASE and "did not start" in str(info.value)
    assert not (tmp_path / "head").exists()  # the second was never launched
