"""One evaluation end to end: measure (runner), decide (verdict), and sign a receipt for the pair.

Shared by `evalbot evaluate` and the poller, so a PR judged on GitHub gets exactly what a maintainer
gets locally.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from evalbot import receipts, verdict
from evalbot.codec import to_dict
from evalbot.evaluate import checkout, runner
from evalbot.model import EvalRequest, Measurements, Verdict
from evalbot.rules import Rules


@dataclass(frozen=True)
class Judgement:
    """What one evaluation produced: the numbers, the verdict, and the (maybe unsigned) receipt."""

    measurements: Measurements
    verdict: Verdict
    receipt: dict[str, Any]

    @property
    def signature_status(self) -> str:
        return receipts.signature_status(self.receipt)


def judge(
    req: EvalRequest, ws: runner.Workspace, log: runner.Log, key: Ed25519PrivateKey | None
) -> Judgement:
    """Evaluate the request in ws, decide under ws's rules, and sign the receipt with key (None: unsigned)."""
    return judged(runner.evaluate(req, ws, log), ws.rules, key)


def judged(m: Measurements, rules: Rules, key: Ed25519PrivateKey | None) -> Judgement:
    """The verdict on measurements under rules, and its receipt."""
    v = verdict.decide(m, rules)
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


# (the request, the repository holding its revisions) -> the judgement
Evaluator = Callable[[EvalRequest, Path], Judgement]


def local_evaluator(
    rules: Rules, work_root: Path, log: runner.Log, *, key: Ed25519PrivateKey | None = None
) -> Evaluator:
    """The poller's Evaluator on this box, in-process, exactly as `evalbot evaluate` measures."""

    def evaluate(req: EvalRequest, repo: Path) -> Judgement:
        judged = judge(req, runner.Workspace(repo, work_root, rules), log, key)
        try:  # one poller per state (its lock): nothing else uses these checkouts; main's stays for the next PR
            checkout.cleanup_worktrees(work_root / "worktrees", keep=(req.base_sha,))
        except OSError as exc:  # disk housekeeping never costs a verdict
            log(f"could not clean the checkouts under {work_root / 'worktrees'}: {exc}")
        return judged

    return evaluate
