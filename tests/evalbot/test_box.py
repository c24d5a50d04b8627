"""The quiet-box check: what other processes use, measured from /proc, named by command name only."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from evalbot.evaluate import box
from evalbot.rules import Quiet

pytestmark = pytest.mark.timing  # times work: runs alone, after the rest (make test)

HZ = 100


def _snap(at: float, busy: int, procs: dict[int, tuple[str, int, int, int]]) -> box.CpuSnapshot:
    return box.CpuSnapshot(at, busy, {pid: box.ProcInfo(*v) for pid, v in procs.items()})


def test_proc_stat_lines_with_spaces_and_parentheses_in_the_name():
    line = "4242 (evil) (name x) R 17 4242 4242 0 -1 4194560 100 0 0 0 250 30 5 7 20 0 1 0 98765 0 0"
    info = box.parse_proc_stat(line)
    assert info.comm == "evil) (name x" and info.ppid == 17
    assert info.ticks == 250 + 30 + 5 + 7 and info.start == 98765


def test_proc_stat_busy_counts_steal_but_not_idle_or_iowait():
    assert box.parse_stat_busy("cpu  100 5 20 9000 70 3 2 11 0 0\ncpu0 1 2 3\n") == 100 + 5 + 20 + 3 + 2 + 11
    with pytest.raises(ValueError):
        box.parse_stat_busy("intr 1 2 3\n")


def test_usage_subtracts_our_tree_and_names_the_others():
    # 10 is us, 11 our engine (it exits and is reaped into 10's cutime), 20 a hog, 30 a pid reused
    a = _snap(
        0.0,
        1000,
        {10: ("python", 1, 50, 1), 11: ("python", 10, 40, 2), 20: ("hog", 1, 500, 3), 30: ("old", 1, 900, 4)},
    )
    b = _snap(
        2.0,
        1000 + 360 + 150 + 20,
        {10: ("python", 1, 50 + 40 + 360, 1), 20: ("hog", 1, 650, 3), 30: ("newer", 1, 20, 99)},
    )
    u = box.usage(a, b, root=10, hz=HZ)
    assert u.own_cores == pytest.approx(360 / HZ / 2)
    assert u.other_cores == pytest.approx(170 / HZ / 2)
    assert u.top == (("hog", pytest.approx(0.75)), ("newer", pytest.approx(0.1)))


def test_busy_time_nobody_can_name_still_counts():
    """Processes too short-lived to be seen by either snapshot (a compile job's gcc) show up in /proc/stat."""
    a = _snap(0.0, 0, {10: ("python", 1, 0, 1)})
    b = _snap(1.0, 150, {10: ("python", 1, 0, 1)})
    u = box.usage(a, b, root=10, hz=HZ)
    assert u.other_cores == pytest.approx(1.5) and u.top == ()
    assert "short-lived processes" in box.busy_reason(u, Quiet())


def test_busy_reason_cpu_and_gpu():
    quiet = Quiet(max_other_cores=0.3, max_gpu_util=5)
    calm = box.Usage(2.0, 0.1, 1.9, (("kworker/0:1", 0.01),), box.GpuState(0.0, ()))
    assert box.busy_reason(calm, quiet) is None
    gpu_busy = box.Usage(2.0, 0.1, 0.0, (), box.GpuState(87.0, ("python3",)))
    assert "GPU is 87% busy" in box.busy_reason(gpu_busy, quiet) and "python3" in box.busy_reason(
        gpu_busy, quiet
    )
    other_app = box.Usage(2.0, 0.0, 0.0, (), box.GpuState(0.0, ("llama-server",)))
    assert "llama-server" in box.busy_reason(other_app, quiet)


def test_our_own_engines_and_probe_on_the_gpu_do_not_make_it_busy():
    """A GPU evaluation's engines (frozen) and its idle probe hold contexts on the device while a pair is
    measured again: nvidia-smi lists them, and only the processes that are not ours count."""
    csv = "4242, /usr/bin/python3\n4243, python3\n77, /opt/llama-server\n[N/A], mystery\n"
    assert box.others_on_gpu(csv, frozenset({4242, 4243})) == ("llama-server", "mystery")
    assert box.others_on_gpu(csv, frozenset()) == ("python3", "python3", "llama-server", "mystery")
    assert box.others_on_gpu("", frozenset({1})) == ()


def test_waiting_gives_up_at_the_limit_and_reports_what_it_saw():
    clock = iter(float(t) for t in range(0, 1000, 5))
    busy = box.Usage(1.0, 1.8, 0.0, (("stress-ng", 1.0), ("make", 0.8)))
    logs = []
    with pytest.raises(box.BoxBusy) as info:
        box.wait_until_quiet(
            Quiet(max_wait_s=30),
            with_gpu=False,
            log=logs.append,
            sample=lambda: busy,
            clock=lambda: next(clock),
        )
    msg = str(info.value)
    assert msg.startswith("box busy: ") and "stress-ng (1.00)" in msg and "make (0.80)" in msg
    assert len(logs) == 1  # one line, not one per sample


def test_waiting_returns_once_the_box_is_quiet():
    samples = iter([box.Usage(1.0, 1.0, 0.0, (("hog", 1.0),)), box.Usage(1.0, 0.02, 0.0, ())])
    clock = iter([0.0, 1.0, 2.0, 3.0])
    u, waited = box.wait_until_quiet(
        Quiet(), with_gpu=False, log=lambda _m: None, sample=lambda: next(samples), clock=lambda: next(clock)
    )
    assert u.other_cores == 0.02 and waited == 2.0


HOG = "import sys; open('/proc/self/comm', 'w').write('evalbot-hog')\nwhile True: pass"


def test_a_real_hog_is_seen_by_name_and_never_by_its_arguments():
    """A busy process outside our tree: found, named by its command name; its argv (which may hold a
    secret) never reaches the message. With it gone, the box is quiet again."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, "--token=SECRET-ARGUMENT"])
    idle = subprocess.Popen(["sleep", "30"])  # stands in for an evaluation that is not running anything
    try:
        time.sleep(0.5)
        u = box.measure(idle.pid, 1.0, with_gpu=False)
        reason = box.busy_reason(u, Quiet(max_other_cores=0.3))
        assert reason is not None and u.other_cores > 0.6
        assert "evalbot-hog" in reason and "SECRET" not in reason and "token" not in reason
        assert dict(u.top)["evalbot-hog"] > 0.6
        ours = box.measure(hog.pid, 1.0, with_gpu=False)  # the hog as our own tree: not counted against us
        assert ours.own_cores > 0.6 and ours.other_cores < u.other_cores
    finally:
        hog.kill()
        hog.wait()
        idle.kill()
        idle.wait()
    assert "evalbot-hog" not in dict(box.measure(os.getpid(), 1.0, with_gpu=False).top)
