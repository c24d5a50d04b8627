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

from evalbot.evaluate import ab_block, ab_samples, ab_sampling, cpumeter, sandbox, served
from evalbot.evaluate.serve_error import ServeError
from evalbot.model import Side

PIN_REFUSED: set[str] = set()


@dataclass
class Proc:
    label: str
    events: list[str]
    fail: bool = False
    vocab: int = 100
    ready: dict = field(default_factory=dict)
    cpu: float | None = None  # CPU seconds its tree used: None, unmetered
    # the CPU time read at the last freeze: -1, unmetered, as a real process without a meter reads
    frozen_cpu_ns: int = -1
    device: None = None  # no GPU idle probe: a CPU profile
    device_idle_ns: int = 0

    def cpu_s(self) -> float | None:
        return self.cpu

    def wait_ready(self, timeout_s: float) -> dict:
        self.events.append(f"ready {self.label}")
        if self.fail:
            raise ServeError(f"{self.label}: exited 1 before its ready line", "Traceback ...", stage="start")
        return self.ready

    def freeze(self, drain: bool = True) -> int:
        self.events.append(f"freeze {self.label}")
        return 0

    def pin(self, cpus: frozenset[int]) -> None:
        self.events.append(f"pin {self.label} {sorted(cpus)}")
        if self.label in PIN_REFUSED:
            raise ServeError(f"{self.label}: could not be pinned to CPUs 1: EPERM", "", stage="pin")

    def close(self) -> None:
        self.events.append(f"close {self.label}")


def _launcher(
    events: list[str],
    failing: Side | None = None,
    vocab: dict[Side, int] | None = None,
    cpu: dict[Side, float] | None = None,
):
    def launch(side: Side) -> Proc:
        events.append(f"launch {side.value}")
        return Proc(
            side.value, events, side is failing, (vocab or {}).get(side, 100), cpu=(cpu or {}).get(side)
        )

    return launch


@pytest.mark.parametrize("parallel", [False, True])
def test_pinned_engines_are_pinned_once_both_are_ready_and_before_any_freeze(parallel):
    events: list[str] = []
    ab_block.start_block(_launcher(events), 10, lambda _m: None, True, parallel=parallel, pin=frozenset({1}))
    pins = [i for i, e in enumerate(events) if e.startswith("pin")]
    readies = [i for i, e in enumerate(events) if e.startswith("ready")]
    freezes = [i for i, e in enumerate(events) if e.startswith("freeze")]
    assert [events[i] for i in pins] == ["pin base [1]", "pin head [1]"]  # both sides on the same CPU
    assert max(readies) < min(pins) and max(pins) < min(freezes)


def test_a_side_the_kernel_will_not_pin_is_that_sides_failure(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PIN_REFUSED", {"head"})
    events: list[str] = []
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(_launcher(events), 10, lambda _m: None, True, pin=frozenset({1}))
    assert info.value.side is Side.HEAD and info.value.stage == "pin"
    assert {e for e in events if e.startswith("close")} == {"close base", "close head"}


@pytest.mark.parametrize("base_first", [True, False])
def test_serial_start_launches_the_second_once_the_first_is_ready(base_first):
    events: list[str] = []
    procs = ab_block.start_block(_launcher(events), 10, lambda _m: None, base_first, parallel=False)
    a, b = ("base", "head") if base_first else ("head", "base")
    assert events == [f"launch {a}", f"ready {a}", f"launch {b}", f"ready {b}", f"freeze {a}", f"freeze {b}"]
    assert set(procs) == {Side.BASE, Side.HEAD}


@pytest.mark.parametrize("base_first", [True, False])
def test_parallel_start_launches_both_before_waiting_and_keeps_the_crossover_s_order(base_first):
    events: list[str] = []
    logged: list[str] = []
    procs = ab_block.start_block(_launcher(events), 10, logged.append, base_first, parallel=True)
    a, b = ("base", "head") if base_first else ("head", "base")
    assert events == [f"launch {a}", f"launch {b}", f"ready {a}", f"ready {b}", f"freeze {a}", f"freeze {b}"]
    assert [m.split("'")[0] for m in logged] == [a, b] and all("ready in" in m for m in logged)
    assert set(procs) == {Side.BASE, Side.HEAD}


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("failing", [Side.BASE, Side.HEAD])
def test_a_side_that_fails_to_start_is_that_side_s_failure_and_nothing_is_left_running(parallel, failing):
    events: list[str] = []
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(_launcher(events, failing), 10, lambda _m: None, True, parallel=parallel)
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
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(launch, 10, lambda _m: None, False, parallel=parallel)
    assert info.value.side is Side.HEAD and "vocabulary" in str(info.value)
    assert sorted(e for e in events if e.startswith("close")) == ["close base", "close head"]


def test_the_load_allowance_is_threads_times_the_slack_plus_the_grace():
    assert ab_block.load_overuse(None, 10, 1) is None  # unmetered
    assert ab_block.load_overuse(1e6, 10, None) is None  # every core is the engine's: nothing to exceed
    allowed = 1 * ab_block.LOAD_CPU_SLACK * 10 + ab_block.LOAD_CPU_GRACE_S
    assert ab_block.load_overuse(allowed, 10, 1) is None
    why = ab_block.load_overuse(allowed + 0.1, 10, 1)
    assert why is not None and "1 thread " in why and f"{allowed + 0.1:.1f} CPU-seconds" in why
    assert ab_block.load_overuse(2 * 10 * 1.4, 10, 2) is None  # two threads: twice the room
    # a real one-thread engine loads at 1.00 core (the 0.5B model on a 2-core VM, 4.6-7.9 s): well inside
    assert ab_block.load_overuse(7.83, 7.89, 1) is None


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("hog", [Side.BASE, Side.HEAD])
def test_a_side_that_used_more_cpu_than_its_threads_while_starting_is_that_side_s_failure(parallel, hog):
    events: list[str] = []
    launch = _launcher(events, cpu={hog: 1000.0, Side.BASE if hog is Side.HEAD else Side.HEAD: 0.5})
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(launch, 10, lambda _m: None, True, parallel=parallel, threads=1)
    assert info.value.side is hog and info.value.stage == "cpu" and "1000.0 CPU-seconds" in str(info.value)
    assert sorted(e for e in events if e.startswith("close")) == ["close base", "close head"]
    assert not any(e.startswith("freeze") for e in events)


def test_without_a_thread_count_there_is_no_load_allowance():
    events: list[str] = []
    launch = _launcher(events, cpu={Side.HEAD: 1000.0, Side.BASE: 1000.0})
    assert set(ab_block.start_block(launch, 10, lambda _m: None, True, parallel=True, threads=None)) == {
        Side.BASE,
        Side.HEAD,
    }


@pytest.mark.parametrize("parallel", [False, True])
def test_main_failing_to_start_while_the_pr_hogged_the_cpu_is_the_pr_s_failure(parallel):
    """A PR that floods the box while main loads starves main's load past its ready timeout: that is the
    PR's failure (a REJECT), not an infrastructure fault it can repeat forever. In the serial start the
    PR loads first (head first) and floods while it waits for main."""
    events: list[str] = []
    launch = _launcher(events, failing=Side.BASE, cpu={Side.HEAD: 1000.0})
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(launch, 10, lambda _m: None, False, parallel=parallel, threads=1)
    assert info.value.side is Side.HEAD and info.value.stage == "cpu"
    assert isinstance(info.value.__cause__, ab_samples.SideError) and info.value.__cause__.side is Side.BASE
    # a PR within its allowance leaves main's failure main's
    events.clear()
    launch = _launcher(events, failing=Side.BASE, cpu={Side.HEAD: 0.5})
    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(launch, 10, lambda _m: None, False, parallel=parallel, threads=1)
    assert info.value.side is Side.BASE and "did not start" in str(info.value)


# ------------------------------------------------------------------ real processes


def _script_server(tmp: Path, name: str, body: str, metered: bool = True) -> served.ServedProcess:
    """A real serving stand-in running `body`, unsandboxed; `metered` as the product meters an engine (its
    cgroup where one can be made here, else its /proc tree)."""
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    spec = sandbox.SandboxSpec(
        ro_binds=(),
        scratch=tmp,
        workdir=tmp,
        env={"PATH": os.environ["PATH"]},
        limits=sandbox.Limits(timeout_s=60),
    )
    meter = cpumeter.make_meter(f"test-{name}") if metered else None
    return served.ServedProcess.start(name, spec, [sys.executable, str(path)], no_sandbox=True, meter=meter)


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
    return _script_server(tmp, me, script, metered=False)


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

    procs = ab_block.start_block(launch, 30, lambda _m: None, False, parallel=True)
    try:
        assert {s: _state(p.proc.pid) for s, p in procs.items()} == {Side.BASE: "T", Side.HEAD: "T"}
    finally:
        ab_block.close(procs)
    assert all(p.proc.poll() is not None for p in procs.values())  # closed: nothing left running


def test_the_same_processes_started_serially_never_meet_and_the_first_is_blamed(tmp_path):
    def launch(side: Side) -> served.ServedProcess:
        other = Side.HEAD if side is Side.BASE else Side.BASE
        return _meeting_server(tmp_path, side.value, other.value, wait_s=2)

    with pytest.raises(ab_samples.SideError) as info:  # the first never sees the second begin: 2 s, then exit
        ab_block.start_block(launch, 30, lambda _m: None, True, parallel=False)
    assert info.value.side is Side.BASE and "did not start" in str(info.value)
    assert not (tmp_path / "head").exists()  # the second was never launched


_READY = (
    'sys.stdout.write(json.dumps({"event": "ready", "protocol": "evalbot.serve/1", '
    '"config": {"vocab_size": 100}}) + "\\n"); sys.stdout.flush()'
)
_FLOOD = f"""
    import json, os, sys, time
    {_READY}
    for _ in range(3):  # spinners that hold the cores while main loads; gone after 8 s whatever happens
        if os.fork() == 0:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                pass
            os._exit(0)
    sys.stdin.readline()  # the shutdown
"""
_IDLE = f"""
    import json, sys
    {_READY}
    sys.stdin.readline()  # the shutdown
"""
_NEVER_READY = """
    import time
    time.sleep(30)
"""


@pytest.mark.parametrize(
    "head_body, blamed", [(_FLOOD, Side.HEAD), (_IDLE, Side.BASE)], ids=["flood", "idle"]
)
def test_real_spinners_forked_by_the_pr_while_main_loads_make_main_s_timeout_the_pr_s_failure(
    tmp_path, monkeypatch, head_body, blamed
):
    """Real processes and the product's meter: the PR is ready at once and forks spinners that hold the
    cores while main "loads" (here: never gets ready, 4 s timeout). Its tree's CPU is read and it is
    blamed; the same PR idle leaves main's failure main's. The allowance is cut to a quarter core plus
    0.5 s here, as a 4 s flood on a 2-core box shared with the other test worker cannot pass 1.5 cores
    plus 2 s, where the real attack (a load held past 900 s) does by hundreds of seconds."""
    monkeypatch.setattr(ab_block, "LOAD_CPU_SLACK", 0.25)
    monkeypatch.setattr(ab_block, "LOAD_CPU_GRACE_S", 0.5)
    bodies = {Side.BASE: _NEVER_READY, Side.HEAD: head_body}
    started: list[served.ServedProcess] = []

    def launch(side: Side) -> served.ServedProcess:
        started.append(_script_server(tmp_path, side.value, bodies[side]))
        return started[-1]

    with pytest.raises(ab_samples.SideError) as info:
        ab_block.start_block(launch, 4, lambda _m: None, True, parallel=True, threads=1)
    assert info.value.side is blamed, str(info.value)
    if blamed is Side.HEAD:
        assert info.value.stage == "cpu" and "CPU-seconds" in str(info.value)
    assert all(p.proc.poll() is not None for p in started)  # both ended


def test_request_overuse_holds_prefill_and_decode_each_to_the_profiles_cores():
    def s(prefill_cpu, prefill_wall, decode_cpu, decode_wall):
        return ab_samples.Sample(
            Side.HEAD, 128, 0, 0, (1,) * 128, (1,) * 9, 128 / prefill_wall, 8 / decode_wall, {},
            decode_s=decode_wall, decode_cpu_s=decode_cpu, prefill_cpu_s=prefill_cpu,
        )  # fmt: skip

    assert ab_sampling.request_overuse(s(0.30, 0.30, 1.0, 1.0), 1) is None
    assert ab_sampling.request_overuse(s(0.60, 0.30, 1.0, 1.0), None) is None  # every core is the engine's
    assert ab_sampling.request_overuse(s(None, 0.30, None, 1.0), 1) is None  # unmetered
    assert "its prefill at ctx 128" in ab_sampling.request_overuse(s(0.60, 0.30, 1.0, 1.0), 1)
    assert "its decode" in ab_sampling.request_overuse(s(0.30, 0.30, 2.0, 1.0), 1)
    assert ab_sampling.request_overuse(s(0.60, 0.30, 2.0, 1.0), 2) is None
