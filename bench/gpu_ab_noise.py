"""Where the served GPU A/B's noise comes from, and how much of it the stream mode removes.

Two identical serving engines (`python -m engine serve`, random-weight shape, compiled, CUDA graph) are
started one after the other through the harness's own `ServedProcess` and both stay resident on the GPU;
requests alternate between them (ABBA, the idle one frozen, the harness's clock), at each context and in
each stream mode:

- `token`: one flushed line per token (the engine syncs with the GPU for every token);
- `ends`: the first token, then the rest in one line (greedy decode with the tokens on the device).

Beside it, `--inprocess` loads the same two engines into this process and alternates them the same way,
timed by wall clock around a device sync: the floor the served path is compared against.

Per request it records the harness's decode rate and the SM clock (NVML, sampled every 5 ms while the
request runs). It prints, per mode and context: each engine's request CV, the pair log-ratio's sd, the A/A
mean ratio (second engine over first) with its 95% CI, and the rate's sensitivity to the SM clock (slope of
log rate on log clock, and the CV left once the clock is regressed out).

    python bench/gpu_ab_noise.py --shape qwen3-8b --ctx 4096 16384 --tokens 128 --pairs 12 \\
        --modes token ends --inprocess --out docs/results/gpu_ab_noise_h200.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalbot import stats  # noqa: E402
from evalbot.evaluate import sandbox  # noqa: E402
from evalbot.evaluate.schedule import run_alone  # noqa: E402
from evalbot.evaluate.served import ServedProcess  # noqa: E402


class Clock:
    """The SM clock sampled by NVML in a thread; mean_between(t0, t1) over monotonic_ns stamps."""

    def __init__(self, period_s: float = 0.005):
        self.samples: list[tuple[int, int]] = []
        self.ok = False
        try:
            pynvml = importlib.import_module("pynvml")  # nvidia-ml-py, on the GPU box only
            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: pynvml.nvmlDeviceGetClockInfo(self._h, pynvml.NVML_CLOCK_SM)
            self._read()
            self.ok = True
        except Exception as exc:
            print(f"no NVML SM clock: {exc}", file=sys.stderr)
            return
        self._stop = threading.Event()
        self.period = period_s
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic_ns(), self._read()))
            time.sleep(self.period)

    def mean_between(self, t0: int, t1: int) -> float | None:
        xs = [c for t, c in self.samples if t0 <= t <= t1]
        return statistics.fmean(xs) if xs else None


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0


def _slope(rates: list[float], clocks: list[float | None]) -> dict[str, Any]:
    """Least squares of log rate on log clock: the slope, and the rate's CV left after it."""
    pts = [(math.log(c), math.log(r)) for r, c in zip(rates, clocks, strict=True) if c]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return {"clock_slope": None, "cv_after_clock": None, "clock_mhz_range": None}
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    resid = [y - my - b * (x - mx) for x, y in pts]
    cs = [math.exp(x) for x, _ in pts]
    return {
        "clock_slope": round(b, 4),
        "cv_after_clock": round(statistics.stdev(resid), 5),
        "clock_mhz_range": [round(min(cs)), round(max(cs))],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """rows: one per request with engine (0/1), pair, rate, clock. The A/A ratio is engine 1 over 0."""
    by_pair: dict[int, dict[int, float]] = {}
    for r in rows:
        by_pair.setdefault(r["pair"], {})[r["engine"]] = r["rate"]
    pairs = [(p[0], p[1]) for p in by_pair.values() if 0 in p and 1 in p]
    est = stats.estimate(pairs) if len(pairs) >= 2 else None
    logs = [math.log(h / b) for b, h in pairs]
    out: dict[str, Any] = {
        "pairs": len(pairs),
        "tok_s_mean": round(statistics.fmean(r["rate"] for r in rows), 2),
        "request_cv": [round(_cv([r["rate"] for r in rows if r["engine"] == e]), 5) for e in (0, 1)],
        "pair_log_sd": round(statistics.stdev(logs), 5) if len(logs) > 1 else None,
        "aa_ratio": round(est.ratio, 5) if est else None,
        "aa_ci": [round(est.ci_low, 5), round(est.ci_high, 5)] if est else None,
        "mde": round(est.mde, 5) if est else None,
        **_slope([r["rate"] for r in rows], [r.get("clock") for r in rows]),
    }
    return out


def served(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    max_seq = max(args.ctx) + args.tokens + 8
    work = Path(tempfile.mkdtemp(prefix="gpu-ab-noise-"))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    spec = sandbox.SandboxSpec(
        ro_binds=(ROOT,),
        scratch=work,
        workdir=ROOT,
        env=env,
        limits=sandbox.Limits(cpu_seconds=36000, timeout_s=36000.0, max_output_bytes=64 << 20),
    )
    argv = [sys.executable, "-m", "engine", "serve", "--random-weights", "--shape", args.shape]
    argv += ["--device", args.device, "--max-seq", str(max_seq), "--seed", "0"]
    procs: list[ServedProcess] = []
    result: dict[str, Any] = {"ready_s": [], "runs": {}}
    try:
        for i in range(2):
            t0 = time.monotonic()
            p = ServedProcess.start(f"engine{i}", spec, argv, no_sandbox=True)
            procs.append(p)
            p.wait_ready(900)
            p.freeze()
            result["ready_s"].append(round(time.monotonic() - t0, 1))
        vocab = procs[0].vocab
        rng = random.Random(7)
        for ctx in args.ctx:
            for mode in args.modes:
                rows = []
                for pair in range(args.pairs):
                    prompt = [rng.randrange(vocab) for _ in range(ctx)]
                    body: dict[str, Any] = {"op": "generate", "prompt_ids": prompt, "max_new": args.tokens}
                    if mode != "token":
                        body["stream"] = mode
                    order = (0, 1) if pair % 4 in (0, 3) else (1, 0)
                    for e in order:
                        others = [q for j, q in enumerate(procs) if j != e]
                        t = run_alone(procs[e], others, partial(procs[e].request, body, 600))
                        lines = len(t.arrivals_ns)
                        rows.append(
                            {
                                "engine": e,
                                "pair": pair,
                                "rate": t.decode_tps,
                                "prefill_s": round(t.prefill_s, 5),
                                "lines": lines,
                                "engine_decode_s": (t.summary.get("timings") or {}).get("decode_s"),
                                "clock": clock.mean_between(t.arrivals_ns[0], t.arrivals_ns[-1])
                                if clock.ok
                                else None,
                            }
                        )
                summary = summarize(rows)
                print(json.dumps({"path": "served", "ctx": ctx, "mode": mode, **summary}), flush=True)
                result["runs"][f"{ctx}/{mode}"] = {**summary, "rows": rows}
    finally:
        for p in procs:
            p.close()
    return result


def inprocess(args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import torch

    from engine import generate as gen

    max_seq = max(args.ctx) + args.tokens + 8
    sessions = []
    for _ in range(2):
        lm = gen.load_random(args.shape, args.device, seed=0, max_pos=max_seq)
        if args.device == "cuda":
            lm.transformer.compile()
        s = gen.Session(lm, max_seq=max_seq)
        warm = [i % lm.cfg.vocab_size for i in range(7, 71)]
        for _ in range(2):
            s.generate(warm, 4, stream=False)
        sessions.append(s)
    vocab = sessions[0].model.cfg.vocab_size
    rng = random.Random(7)
    result: dict[str, Any] = {"runs": {}}
    for ctx in args.ctx:
        rows = []
        for pair in range(args.pairs):
            prompt = [rng.randrange(vocab) for _ in range(ctx)]
            order = (0, 1) if pair % 4 in (0, 3) else (1, 0)
            for e in order:
                s = sessions[e]
                s.reset()
                logits = s.forward(prompt)
                first = logits.argmax(-1).view(1)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.monotonic_ns()
                s.greedy_on_device(first, args.tokens - 1).tolist()
                t1 = time.monotonic_ns()
                rows.append(
                    {
                        "engine": e,
                        "pair": pair,
                        "rate": (args.tokens - 1) / ((t1 - t0) / 1e9),
                        "clock": clock.mean_between(t0, t1) if clock.ok else None,
                    }
                )
        summary = summarize(rows)
        print(json.dumps({"path": "inprocess", "ctx": ctx, **summary}), flush=True)
        result["runs"][str(ctx)] = {**summary, "rows": rows}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--ctx", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script on a small shape")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=12, help="pairs per context and mode")
    ap.add_argument("--modes", nargs="+", choices=("token", "ends"), default=["token", "ends"])
    ap.add_argument("--inprocess", action="store_true", help="also the in-process floor")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    clock = Clock()
    t0 = time.monotonic()
    record: dict[str, Any] = {
        "shape": args.shape,
        "tokens": args.tokens,
        "pairs": args.pairs,
        "date": time.strftime("%Y-%m-%d"),
    }
    record["served"] = served(args, clock)
    if args.inprocess:
        record["inprocess"] = inprocess(args, clock)
    record["wall_s"] = round(time.monotonic() - t0, 1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    print(f"wall {record['wall_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
