"""Red team of the two-part clock (#36 part 4), by a helper playing a PR that wants a speed tier
without real work. What it tried that did not work is in docs/benchmarks.md (#36 part 4). Of the two holes it
found, the CPU after a prefill's answer is now on the prefill's CPU clock (tested below); the GPU's queued
work is kept as a strict xfail, its fix still to do.

The freezer (cgroup or SIGSTOP) stops the engine's *host* processes; the CPU meter and the byte count of
its stdout see only them. On a GPU, work the engine queued before it was frozen keeps running on the
device while the other side is timed, and nothing in the harness looks at the GPU during a pair
(`abtest._pair` calls `box.usage` with no GPU state). The two-part request makes this cheaper than ever:
the prefill's answer carries no token, so it needs no host sync, and an engine can answer `done` with its
prefill (or any amount of other work) still queued on the device. Where the PR's prefill is answered just
before main's continuation is sent (main first in the pair: prefills main, PR; continuations main, PR),
that queued work runs during main's timed decode and slows it: the PR reads faster by main reading slower.

The helper also wrote the same attack against two real CUDA engines (a prefill answered with
`torch.cuda._sleep` still queued). It is not kept: it has never run (the session's device time was spent),
so its threshold was a guess.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalbot.evaluate import ab_samples, ab_twopart, abtest, box, cpumeter, sandbox, schedule, served
from evalbot.model import Side
from evalbot.rules import Quiet

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ the same hole, seen without a GPU

READY = """
import json, sys, time
def send(o):
    sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100},
      "ops": ["generate", "prefill"]})
"""

STAND_IN = (
    READY
    + """
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    if req["op"] == "prefill":
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})
        continue
    n = req["max_new"]
    time.sleep(0.005)
    send({"id": rid, "tok": 1})
    time.sleep(0.005)
    send({"id": rid, "toks": [2] * (n - 1)})
    send({"id": rid, "event": "done", "n": n})
"""
)


@pytest.mark.xfail(
    strict=True,
    reason="HOLE (GPU profiles, #36 part 5): freezing stops an engine's host processes, not the kernels it "
    "queued; a GPU pair never asks the device whether a frozen side keeps it busy. Fix to build and measure "
    "on the device: after freezing, wait for the device to be idle with every engine but the timed one "
    "frozen, and fail (stage 'frozen') a side that keeps it busy",
)
def test_a_gpu_pair_accepts_a_frozen_side_that_keeps_the_device_busy(tmp_path, monkeypatch):
    """The device as nvidia-smi would show it while the PR's engine is frozen with work still queued (the
    CUDA test above plays it for real): busy, the PR's process on it. A GPU pair never asks (`_pair`
    passes no GPU state to `box.usage`, `run_alone` freezes host processes only), so main's decode is
    timed next to the PR's queued kernels and the pair is kept. The harness should find the device busy
    with every engine but the timed one frozen, and refuse (the frozen side's failure) or measure again."""
    asked: list[int] = []

    def busy_gpu() -> box.GpuState:
        asked.append(1)
        return box.GpuState(util=100.0, apps=("python3",))  # the frozen PR's context, still running

    monkeypatch.setattr(box, "gpu_state", busy_gpu)
    procs = {}
    try:
        for side in (Side.BASE, Side.HEAD):
            path = tmp_path / f"{side.value}.py"
            path.write_text(textwrap.dedent(STAND_IN))
            env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
            spec = sandbox.SandboxSpec(
                ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
                limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
            )  # fmt: skip
            procs[side] = served.ServedProcess.start(side.value, spec, [PY, str(path)], no_sandbox=True)
            procs[side].wait_ready(10)
        assert ab_twopart.two_part(procs)
        prompts = ab_samples.Prompts(lambda ctx, i: [i % 100] * ctx)
        quiet = Quiet(max_other_cores=1e9, max_gpu_util=5, sample_s=0.01, max_wait_s=0)
        with pytest.raises((ab_samples.SideError, box.BoxBusy)):
            abtest._pair(
                procs, 0, 0, 5, prompts, 4, 10, quiet, True, lambda _m: None, ab_samples.Run(),
                stream="ends", two=True,
            )  # fmt: skip
    finally:
        print(f"gpu_state asked {len(asked)} times during a GPU pair")
        for p in procs.values():
            p.close()


# ------------------------------------------------------------------ work after the prefill's answer

AFTER = (
    READY
    + """
after = 0.0
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    if req["op"] == "prefill":
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})  # answered, the work not done
        t0, last = time.thread_time(), time.monotonic()
        while True:  # the prefill's work goes on until the harness freezes it (a gap in the wall clock)
            now = time.monotonic()
            if now - last > 0.05:
                break
            last, after = now, time.thread_time() - t0
        continue
    n = req["max_new"]
    send({"id": rid, "tok": 1})
    send({"id": rid, "toks": [2] * (n - 1)})
    send({"id": rid, "event": "done", "n": n, "after_ms": after * 1e3})
"""
)


@pytest.mark.timing
def test_work_done_after_the_prefill_answer_and_before_the_freeze_is_on_the_prefill_cpu_clock(tmp_path):
    """A two-part prefill is answered by its done line, and the engine is frozen only once the harness has
    read that line: whatever it computes in between (the prefill's remaining work, any precompute that
    needs no continuation token) was on no clock, 2-7 ms a request on the 2-core VM (SIGSTOP mode). The
    prefill's CPU clock now ends at the freeze that follows it, so that work is on the guarded prefill:
    the harness's reading covers what the engine itself counted after its answer."""
    meter = cpumeter.make_meter("after-test")
    if not isinstance(meter, cpumeter.CgroupMeter):
        meter.close()
        pytest.skip("needs the cgroup meter: a few ms of CPU are below /proc's 10 ms ticks")
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    path = tmp_path / "pr.py"
    path.write_text(textwrap.dedent(AFTER))
    spec = sandbox.SandboxSpec(
        ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
        limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
    )  # fmt: skip
    p = served.ServedProcess.start("pr", spec, [PY, str(path)], no_sandbox=True, meter=meter)
    try:
        p.wait_ready(10)
        p.freeze()
        seen = []
        for _ in range(5):
            pre = schedule.run_alone(p, [], lambda: p.request({"op": "prefill", "prompt_ids": [1, 2, 3]}, 10))
            time.sleep(0.2)  # the other side's prefill, with this one frozen
            body = {"op": "generate", "continue": True, "prompt_ids": [7], "max_new": 4, "stream": "ends"}
            t = schedule.run_alone(p, [], lambda body=body: p.request(body, 10))
            assert pre.answer_cpu_s is not None
            seen.append((pre.answer_cpu_s * 1e3, t.summary["after_ms"]))
        print("prefill CPU clock ms, the engine's own CPU ms after its answer:", seen)
        assert any(after > 0.5 for _, after in seen), f"the engine worked after its answer: {seen}"
        assert all(clock >= after - 0.05 for clock, after in seen), seen
    finally:
        p.close()
