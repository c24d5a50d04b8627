"""The GPU idle probe: a trusted program the harness starts (by this file's path, with its own interpreter,
never the PR's) once per GPU evaluation, to learn whether any engine's work is still running on the device.

Freezing an engine stops its host processes, not what it queued on the GPU: kernels it launched before the
freeze run on while the other side is timed, and slow it (#36). Contexts of different processes share the
device by time slices (no MPS): while another context has work, a kernel of this process waits for its
slice, so a tiny kernel and a sync take a slice's length instead of tens of microseconds. The probe times
such round trips (`drain`): the device is idle once `confirm` of them in a row come back as fast as on an
idle device, and it reports how long after it was asked the last slow one ended (the time the frozen
engine kept the device busy).

Protocol, one JSON object a line: it prints `{"event": "ready", "idle_ns": [...]}` (round trips on the idle
device, measured at its start, before any engine runs), then for each `{"limit_ms": L}` read from stdin it
answers `{"idle": bool, "busy_ns": N, "probes": K, "slowest_ns": S}`. It imports nothing of evalbot, so it
runs the same from a checkout and from an installed wheel.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

CONFIRM = 3  # round trips in a row as fast as on the idle device: idle
CALIBRATION = 200  # round trips timed on the idle device at the start
# a round trip slower than this many times the idle device's 99th percentile (and at least MIN_QUICK_NS
# past its median) is the device busy with another context. Measured on an H100 (bench/gpu_idle_probe.py,
# docs/benchmarks.md): 13 µs on an idle device (p99 27), 0.27-0.37 ms for the first one after another
# context ran (the switch to this one), 2.4 ms while another context's kernel runs (its time slice)
QUICK_FACTOR = 3.0
MIN_QUICK_NS = 500_000


def quick_ns(idle_ns: list[int]) -> int:
    """The slowest round trip that still counts as an idle device, from round trips timed on one. Pure."""
    s = sorted(idle_ns)
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return max(int(QUICK_FACTOR * p99), s[len(s) // 2] + MIN_QUICK_NS)


def drain(
    round_trip: Callable[[], int],
    clock: Callable[[], int],
    quick: int,
    limit_ns: int,
    confirm: int = CONFIRM,
) -> dict[str, int | bool]:
    """Time round trips until `confirm` in a row are quick (idle) or `limit_ns` has passed (not idle).
    `busy_ns` is when the last slow one ended, from the start: the time the device stayed busy. Pure, given
    its two callables."""
    start = clock()
    busy_until = start
    fast = probes = slowest = 0
    while True:
        took = round_trip()
        end = clock()
        probes += 1
        slowest = max(slowest, took)
        if took <= quick:
            fast += 1
            if fast >= confirm:
                return {"idle": True, "busy_ns": busy_until - start, "probes": probes, "slowest_ns": slowest}
        else:
            fast = 0
            busy_until = end
        if end - start >= limit_ns:
            return {"idle": False, "busy_ns": end - start, "probes": probes, "slowest_ns": slowest}


def main(argv: list[str]) -> int:
    import torch  # the harness's own torch (the GPU box's), never the PR's venv

    device = torch.device("cuda", int(argv[1]) if len(argv) > 1 else 0)
    buf = torch.zeros(1, device=device)
    clock = time.perf_counter_ns

    def round_trip() -> int:
        t0 = clock()
        buf.add_(1)
        torch.cuda.synchronize(device)
        return clock() - t0

    for _ in range(20):
        round_trip()
    idle = [round_trip() for _ in range(CALIBRATION)]
    quick = quick_ns(idle)

    def send(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    send({"event": "ready", "idle_ns": sorted(idle), "quick_ns": quick})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "shutdown":
            break
        send(drain(round_trip, clock, quick, int(float(req["limit_ms"]) * 1e6)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
