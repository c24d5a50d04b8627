"""Both engines of a block on the same CPUs (`measurement.pin`): the CPU lists, the choice of CPUs, the pin
on a real sandboxed process tree (threads and children), and an engine that widens its affinity again to run
somewhere faster: it fails its side at the next thaw, or, under a cgroup cpuset, cannot widen at all."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalbot.evaluate import cpumeter, pinning, sandbox, serve_error, served

needs_two = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")


def test_cpu_lists_read_and_write_as_the_kernel_writes_them():
    assert pinning.parse_cpu_list("0-3,5\n") == {0, 1, 2, 3, 5}
    assert pinning.parse_cpu_list("7") == {7}
    assert pinning.format_cpu_list({5, 0, 1, 2, 3}) == "0-3,5"
    assert pinning.format_cpu_list({1, 3}) == "1,3"
    for bad in ("3-1", "a", "1-x"):
        with pytest.raises(ValueError):
            pinning.parse_cpu_list(bad)


def test_the_engines_get_the_last_cpus_and_the_harness_keeps_the_first():
    assert pinning.engine_cpus({0, 1}, 1) == {1}
    assert pinning.engine_cpus({2, 3, 8, 9}, 2) == {8, 9}
    assert pinning.engine_cpus({4}, 2) == {4}  # fewer CPUs than threads: all of them, shared
    with pytest.raises(ValueError):
        pinning.engine_cpus(set(), 1)


ENGINE = textwrap.dedent("""
    import json, os, sys, threading, time
    everywhere = os.sched_getaffinity(0)  # before the harness pins it
    def send(o):
        sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
    if os.fork() == 0:
        time.sleep(3600)
    send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100}})
    for line in sys.stdin:  # {"widen": true}: take every CPU back, this thread and a new one
        if json.loads(line).get("widen"):
            try:
                os.sched_setaffinity(0, everywhere)
            except OSError:
                pass
            threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
            send({"event": "widened", "now": sorted(os.sched_getaffinity(0))})
""")


def _start(tmp: Path, meter: cpumeter.Meter) -> served.ServedProcess:
    script = tmp / "engine.py"
    script.write_text(ENGINE)
    spec = sandbox.SandboxSpec(
        ro_binds=(*sandbox.system_ro_binds(), Path(sys.prefix).resolve(), tmp),
        scratch=tmp / "scratch",
        workdir=tmp / "scratch",
        env={"PATH": "/usr/bin:/bin"},
        limits=sandbox.Limits(timeout_s=60, cpu_seconds=60),
    )
    spec.scratch.mkdir(exist_ok=True)
    p = served.ServedProcess.start(
        "PR", spec, [sys.executable, "-I", "-S", str(script)], no_sandbox=False, meter=meter
    )
    p.wait_ready(30)
    return p


def _widen(p: served.ServedProcess) -> list[int]:
    p.proc.stdin.write(b'{"widen": true}\n')
    p.proc.stdin.flush()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = p.lines.get(timeout=10)
        if line is not None and not isinstance(line, Exception) and line.obj.get("event") == "widened":
            return list(line.obj["now"])
    raise AssertionError("the engine did not answer")


def _allowed(p: served.ServedProcess) -> list[frozenset[int] | None]:
    return [pinning.allowed(t) for t in pinning.tree_tasks(p.proc.pid)]


pytestmark_sandbox = pytest.mark.skipif(not sandbox.sandbox_available(), reason="bubblewrap cannot run here")


@needs_two
@pytestmark_sandbox
def test_every_task_of_a_sandboxed_tree_is_pinned_threads_and_children_alike(tmp_path):
    cpus = pinning.engine_cpus(pinning.usable_cpus(), 1)
    p = _start(tmp_path, cpumeter.TreeMeter())
    try:
        assert len(pinning.tree_tasks(p.proc.pid)) >= 4  # bwrap, python and its thread, the child
        p.pin(cpus)
        assert p.pinned == cpus and p.pinned_by == pinning.AFFINITY
        assert all(a is None or a == cpus for a in _allowed(p))
        p.freeze()
        p.thaw()  # nothing left its pin: no failure
    finally:
        p.close()


@needs_two
@pytestmark_sandbox
def test_an_engine_that_widens_its_affinity_again_fails_its_side_at_the_next_thaw(tmp_path):
    cpus = pinning.engine_cpus(pinning.usable_cpus(), 1)
    p = _start(tmp_path, cpumeter.TreeMeter())
    try:
        p.pin(cpus)
        assert set(_widen(p)) > cpus  # it ran somewhere else
        p.freeze()
        with pytest.raises(serve_error.ServeError, match="left the CPUs it was pinned to") as info:
            p.thaw()
        assert info.value.stage == "cpu" and p.broken
    finally:
        p.close()


def _cpuset_meter() -> cpumeter.Meter:
    meter = cpumeter.make_meter("pin-test")
    probe = pinning.format_cpu_list(pinning.usable_cpus())
    if not isinstance(meter, cpumeter.CgroupMeter) or not meter.pin(probe):
        meter.close()
        pytest.skip("this box gives the harness no cgroup v2 cpuset")
    return meter


@needs_two
@pytestmark_sandbox
def test_under_a_cgroup_cpuset_an_engine_cannot_widen_its_affinity(tmp_path):
    cpus = pinning.engine_cpus(pinning.usable_cpus(), 1)
    meter = _cpuset_meter()
    p = _start(tmp_path, meter)
    try:
        p.pin(cpus)
        assert p.pinned_by == pinning.CPUSET
        assert set(_widen(p)) <= cpus
        assert all(a is None or a <= cpus for a in _allowed(p))
        p.freeze()
        p.thaw()
    finally:
        p.close()
        meter.close()
