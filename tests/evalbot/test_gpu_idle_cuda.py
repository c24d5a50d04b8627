"""The GPU half of #36's red team, on a real device: a PR's engine that answers its prefill with work still
queued on the GPU, so that the work runs while main's decode is timed. Two real CUDA serving engines (torch),
the harness's own pair (`abtest._pair`, two parts) and its real idle probe (`device_idle.Probe`).

Without the probe the attack works (main's decode reads slower next to the queued work); with it, the work
is on the PR's own prefill clock and main's decode reads as it does next to an honest PR; work past the
drain limit fails the PR (stage 'frozen'). Runs through the device tool: `pytest -m gpu`."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from evalbot.evaluate import ab_samples, abtest, box, device_idle, sandbox, served
from evalbot.model import Side
from evalbot.rules import Quiet

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PY = sys.executable

ENGINE = """
import json, sys, time, torch
QUEUE_MS = float(sys.argv[1])
dev = torch.device("cuda", 0)
w = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
x = torch.randn(64, 4096, device=dev, dtype=torch.float16)
t0 = time.perf_counter(); torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
per_cycle = (time.perf_counter() - t0) / 1e7
def send(o):
    sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
def step(rows):
    y = x[:rows]
    for _ in range(6):
        y = torch.tanh(y @ w)
    return y
send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100},
      "ops": ["generate", "prefill"]})
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    if req["op"] == "prefill":
        for _ in range(len(req["prompt_ids"]) // 64):
            step(64)
        if QUEUE_MS:  # > 0, the attack: answer with the work (and more) still queued on the device
            torch.cuda._sleep(int(abs(QUEUE_MS) / 1e3 / per_cycle))
        if QUEUE_MS <= 0:  # < 0: an honest prefill that long, waited for
            torch.cuda.synchronize()
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})
        continue
    n = req["max_new"]
    toks = []
    for _ in range(n):
        toks.append(int(step(1).argmax().item()) % 100)
    send({"id": rid, "tok": toks[0]})
    send({"id": rid, "toks": toks[1:]})
    send({"id": rid, "event": "done", "n": n})
"""


def _pair(
    tmp_path: Path, queue_ms: float, probe: device_idle.Probe | None, monkeypatch
) -> list[ab_samples.Sample]:
    monkeypatch.setattr(box, "gpu_state", lambda *_a: None)
    procs: dict[Side, served.ServedProcess] = {}
    path = tmp_path / "engine.py"
    path.write_text(textwrap.dedent(ENGINE))
    try:
        for side in (Side.BASE, Side.HEAD):
            env = {k: os.environ[k] for k in ("PATH", "HOME", "CUDA_VISIBLE_DEVICES") if k in os.environ}
            spec = sandbox.SandboxSpec(
                ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
                limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=120),
            )  # fmt: skip
            argv = [PY, str(path), str(queue_ms if side is Side.HEAD else 0)]
            procs[side] = served.ServedProcess.start(side.value, spec, argv, no_sandbox=True)
            procs[side].wait_ready(120)
            procs[side].device = probe
        quiet = Quiet(max_other_cores=1e9, max_gpu_util=100, sample_s=0.01, max_wait_s=0)
        prompts = ab_samples.Prompts(lambda ctx, i: [i % 100] * ctx)
        out: list[ab_samples.Sample] = []
        for i in range(4):  # main first in pairs 0 and 2: the PR's prefill answers just before main's decode
            out += abtest._pair(
                procs, 0, i, 2048, prompts, 32, 120, quiet, True, lambda _m: None, ab_samples.Run(),
                stream="ends", two=True,
            )  # fmt: skip
        return out
    finally:
        for p in procs.values():
            p.close()


def _main_decode(samples: list[ab_samples.Sample]) -> float:
    return min(s.decode_s for s in samples if s.side is Side.BASE and s.went_first)


def _prefill_s(s: ab_samples.Sample) -> float:
    return s.context / s.prefill_tps


def _head_prefill(samples: list[ab_samples.Sample]) -> float:
    return min(_prefill_s(s) for s in samples if s.side is Side.HEAD)


@pytest.fixture(scope="module")
def probe():
    p = device_idle.Probe.start(PY)
    yield p
    p.close()


class LoggedProbe:
    """The real probe, its drains kept for the printout."""

    def __init__(self, probe: device_idle.Probe):
        self.probe, self.drains = probe, []

    def drain(self, limit_s: float) -> device_idle.Drain:
        d = self.probe.drain(limit_s)
        self.drains.append(d)
        return d


def test_queued_work_slows_main_without_the_probe_and_is_the_prs_with_it(tmp_path, monkeypatch, probe):
    honest = _pair(tmp_path, 0, probe, monkeypatch)
    # as much device work in the PR's prefill, waited for: what the device does after it, honestly
    long = _pair(tmp_path, -300, probe, monkeypatch)
    attacked = _pair(tmp_path, 300, None, monkeypatch)
    logged = LoggedProbe(probe)
    caught = _pair(tmp_path, 300, logged, monkeypatch)  # type: ignore[arg-type]
    for name, run in (("honest", honest), ("long", long), ("attacked", attacked), ("caught", caught)):
        print(name, [(s.side.value, s.went_first, round(s.decode_s * 1e3, 1), round(_prefill_s(s) * 1e3, 1))
                     for s in run])  # fmt: skip
    print("caught drains (busy ms):", [round(d.busy_ns / 1e6, 2) for d in logged.drains])
    base = _main_decode(honest)
    print(
        f"main's decode next to an honest PR {base * 1e3:.1f} ms; next to 300 ms queued, unprobed "
        f"{_main_decode(attacked) * 1e3:.1f} ms, probed {_main_decode(caught) * 1e3:.1f} ms; the PR's "
        f"prefill honest {_head_prefill(honest) * 1e3:.1f} ms, unprobed {_head_prefill(attacked) * 1e3:.1f} "
        f"ms, probed {_head_prefill(caught) * 1e3:.1f} ms"
    )
    assert _main_decode(attacked) > 1.2 * base  # the attack, as it worked before the probe
    assert _main_decode(caught) < 1.1 * _main_decode(long)  # main decodes as after an honest long prefill
    # and the queued work is on the PR's prefill clock, as if it had waited for it (H100: 289.7 ms charged
    # for 300 ms of `_sleep` by its cycle estimate; the first device run had asserted 300 ms flat)
    assert _head_prefill(caught) >= 0.9 * _head_prefill(long)
    assert all(s.side is Side.HEAD or _prefill_s(s) < 0.3 for s in caught)


def test_work_queued_past_the_limit_fails_the_pr(tmp_path, monkeypatch, probe):
    with pytest.raises(ab_samples.SideError) as err:
        _pair(tmp_path, device_idle.DRAIN_LIMIT_S * 1e3 + 1000, probe, monkeypatch)
    assert err.value.side is Side.HEAD and err.value.stage == "frozen"
    # the probe is still good for the next evaluation's pairs once the device has run the work
    assert probe.drain(10).idle
