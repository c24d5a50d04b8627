"""How late the harness's reader thread takes an engine's lines, and what that did to a pipe's clock:

    .venv/bin/python bench/reader_lateness.py [--requests 200] [--tokens 32] [--gap-us 100]

A writer process stands for a fast engine: each request, `--tokens` lines `--gap-us` apart, each its own
write, on the stamped socket the harness gives an engine's stdout (`evalbot.evaluate.stamped`). A reader
thread reads them as the harness does, under three loads: none, a Python thread spinning in the reader's
process (it holds the GIL: the bot's poller, the GitHub double, a box sampler), and two processes spinning
on the box's cores. Per line: how long after its write (the kernel's stamp) the reader took it. Per request:
whether a pipe's clock (a reader that wakes when this one did and takes every line written by then) saw
its tokens as one burst and what rate it read, against the stamps' rate.
"""

from __future__ import annotations

import argparse
import multiprocessing
import select
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evalbot.evaluate import stamped

WRITER = """
import os, sys, time
n, gap, reqs = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
for r in range(reqs):
    sys.stdin.readline()
    for t in range(n):
        t0 = time.perf_counter()
        os.write(1, b'{"id":"g%d","tok":%d}\\n' % (r, t))
        while time.perf_counter() - t0 < gap:
            pass
"""


def spin_forever() -> None:
    while True:
        pass


def spin_until(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def measure(requests: int, tokens: int, gap_s: float, load: str) -> dict[str, float]:
    chan, theirs = stamped.open_pair()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tokens), str(gap_s), str(requests)],
                            stdin=subprocess.PIPE, stdout=theirs.fileno())  # fmt: skip
    theirs.close()
    hogs: list[multiprocessing.Process] = []
    stop = threading.Event()
    if load == "gil":
        threading.Thread(target=spin_until, args=(stop,), daemon=True).start()
    elif load == "cores":
        hogs = [multiprocessing.Process(target=spin_forever, daemon=True) for _ in range(2)]
        for h in hogs:
            h.start()
    late_us: list[float] = []
    bursts, pipe_rates, stamp_rates = 0, [], []
    buf = bytearray(chan.max_message + 1)
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    assert proc.stdin is not None
    for _ in range(requests):
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        reads: list[int] = []  # per line: the read time
        stamps: list[int] = []
        pending = b""
        while len(stamps) < tokens:
            poller.poll()
            try:
                n, at, _ = chan.receive(buf)
            except BlockingIOError:
                continue
            read = time.monotonic_ns()
            pending += bytes(buf[:n])
            while b"\n" in pending:
                _, pending = pending.split(b"\n", 1)
                reads.append(read)
                stamps.append(at)
                late_us.append((read - at) / 1e3)
        # a pipe's reader, waking when this one did, takes every line written by then: a line's time on a
        # pipe's clock is the first read at or after its write
        pipe = [min(r for r in reads if r >= at) for at in stamps]
        if pipe[-1] == pipe[0]:
            bursts += 1
        else:
            pipe_rates.append((tokens - 1) / ((pipe[-1] - pipe[0]) / 1e9))
        stamp_rates.append((tokens - 1) / ((stamps[-1] - stamps[0]) / 1e9))
    proc.stdin.close()
    proc.wait()
    stop.set()
    for h in hogs:
        h.kill()
    chan.close()
    late_us.sort()
    q = lambda p: late_us[min(len(late_us) - 1, int(p * len(late_us)))]  # noqa: E731
    return {
        "late_p50_us": q(0.5),
        "late_p99_us": q(0.99),
        "late_max_us": late_us[-1],
        "bursts": bursts,
        "pipe_rate_median": statistics.median(pipe_rates) if pipe_rates else float("nan"),
        "stamp_rate_median": statistics.median(stamp_rates),
        "stamp_rate_cv": statistics.pstdev(stamp_rates) / statistics.mean(stamp_rates),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--gap-us", type=float, default=100.0)
    a = ap.parse_args()
    print(
        f"{a.requests} requests of {a.tokens} tokens, {a.gap_us:g} us apart (a {1e6 / a.gap_us:,.0f} tok/s engine)"
    )
    print(
        "| load | reader late p50 / p99 / max (us) | requests one read (a pipe's burst) | pipe clock, median tok/s | stamps, median tok/s (CV) |"
    )
    print("|---|---|--:|--:|--:|")
    for load in ("none", "gil", "cores"):
        r = measure(a.requests, a.tokens, a.gap_us / 1e6, load)
        print(f"| {load} | {r['late_p50_us']:.0f} / {r['late_p99_us']:.0f} / {r['late_max_us']:.0f} | "
              f"{r['bursts']} of {a.requests} | {r['pipe_rate_median']:,.0f} | "
              f"{r['stamp_rate_median']:,.0f} ({r['stamp_rate_cv']:.1%}) |")  # fmt: skip


if __name__ == "__main__":
    main()
