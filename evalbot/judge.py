"""One evaluation end to end: measure (runner), decide (verdict), and sign a receipt for the pair.

Shared by `evalbot evaluate` and the poller, so a PR judged on GitHub gets exactly what a maintainer
gets locally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from evalbot import receipts, verdict
from evalbot.codec import to_dict
from evalbot.evaluate import runner
from evalbot.model import Measurements, Verdict


@dataclass(frozen=True)
class Judgement:
    """What one evaluation produced: the numbers, the verdict, and the (maybe unsigned) receipt."""

    measurements: Measurements
    verdict: Verdict
    receipt: dict[str, Any]

    @property
    def signature_status(self) -> str:
        return receipts.signature_status(self.receipt)


def judge(cfg: runner.EvalConfig, log: runner.Log, key: Ed25519PrivateKey | None) -> Judgement:
    """Evaluate cfg's pair, decide under cfg's rules, and sign the receipt with key (None: unsigned)."""
    m = runner.evaluate(cfg, log)
    v = verdict.decide(m, cfg.rules)
    return Judgement(m, v, receipt(m, v, key))


def receipt(m: Measurements, v: Verdict, key: Ed25519PrivateKey | None) -> dict[str, Any]:
    """The receipt for a verdict; an evaluation that stopped early records why it lacks pinned fields."""
    p = m.provenance
    try:
        body = receipts.build_receipt(
            pr=p.pr, head_sha=p.head_sha, base_sha=p.base_sha, harness_sha=p.harness_sha, rules_hash=p.rules_hash,
            measured_sha=p.measured_sha or None,
            model_sha256s=p.model_sha256s, engine_build=p.engine_build, box=p.box, measurements=to_dict(m),
            verdict=to_dict(v), started_at=p.started_at, finished_at=p.finished_at,
            reference=p.reference)  # fmt: skip
    except receipts.ReceiptError as exc:
        body = {
            "schema": receipts.SCHEMA,
            "incomplete": str(exc),
            "measurements": to_dict(m),
            "verdict": to_dict(v),
        }
    return receipts.sign(body, key) if key else receipts.unsigned(body)
