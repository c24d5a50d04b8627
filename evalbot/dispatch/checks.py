"""Dispatch's pure half: requests, handles and outcomes, and every check of what a runner sent back
(its artifact, its receipt, the binding to the request). No I/O."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from evalbot import receipts, verdict
from evalbot.codec import from_dict
from evalbot.judge import Judgement
from evalbot.model import EvalRequest, Measurements, Status, Verdict, WorkflowRun
from evalbot.model.github import RunPlacement
from evalbot.rules import Rules

ARTIFACT_PREFIX = "evalbot-result-"
RESULT_FILE, RECEIPT_FILE = "result.json", "receipt.json"
# A dispatch whose run id GitHub did not return must show up in the run list within this long; past
# it the dispatch is taken as lost (a crash before the call, or a call GitHub never acted on).
DISCOVERY_S = 15 * 60
RUN_LIST_LIMIT = 100  # the newest runs of the workflow searched for a request id
# Conclusions after which the artifact is worth reading: evaluate exits non-zero on a REJECT.
READABLE_CONCLUSIONS = frozenset({"success", "failure"})
_GIT_SHA = re.compile(r"[0-9a-f]{40}")
_REQUEST_ID = re.compile(r"[a-z0-9][a-z0-9-]{7,99}")
RUNNER_NAME = re.compile(r"[^,\s]+")

# (run id) -> the name of the runner that took the run's job, or None when none did or it is unknown
RunnerLookup = Callable[[int], "str | None"]


# ---------------------------------------------------------------- requests, handles, outcomes


@dataclass(frozen=True)
class DispatchRequest:
    """One attempt at one evaluation: what to measure, under which rules, and the id its run carries."""

    pr: int
    head_sha: str
    base_sha: str
    profile: str
    rules_hash: str
    request_id: str
    attempt: int = 1
    exclude_runners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.pr, bool) or not isinstance(self.pr, int) or self.pr <= 0:
            raise ValueError(f"pr must be a positive int, got {self.pr!r}")
        for name in ("head_sha", "base_sha"):
            if not _GIT_SHA.fullmatch(getattr(self, name)):
                raise ValueError(f"{name} must be a full 40-hex git sha, got {getattr(self, name)!r}")
        if not _REQUEST_ID.fullmatch(self.request_id):
            raise ValueError(f"request_id must be 8-100 of [a-z0-9-], got {self.request_id!r}")
        if self.attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {self.attempt}")
        for name in self.exclude_runners:
            if not RUNNER_NAME.fullmatch(name):
                raise ValueError(f"runner name {name!r} cannot go in a comma-separated list")

    @property
    def artifact_name(self) -> str:
        """The artifact the run must upload."""
        return ARTIFACT_PREFIX + self.request_id


def new_request(ev: EvalRequest) -> DispatchRequest:
    """The first attempt at an evaluation, serialised for the workflow's inputs (the profile by name: the
    runner reads it from the rules at the trusted ref, whose hash the request pins)."""
    if ev.pr is None:
        raise ValueError("a dispatched evaluation is of a PR")
    return _attempt(ev.pr, ev.head_sha, ev.base_sha, ev.profile.name, ev.rules_hash, 1, ())


def _attempt(pr: int, head_sha: str, base_sha: str, profile: str, rules_hash: str, attempt: int,
             exclude_runners: tuple[str, ...]) -> DispatchRequest:  # fmt: skip
    """A request with a fresh request id (unique per attempt, so a late run of an old attempt is ignored)."""
    request_id = f"evalbot-{pr}-{head_sha[:12]}-{attempt}-{secrets.token_hex(4)}"
    return DispatchRequest(pr, head_sha, base_sha, profile, rules_hash, request_id, attempt, exclude_runners)


@dataclass(frozen=True)
class DispatchHandle(RunPlacement):
    """A dispatched request: where it went, when it must be done by, and its run once known."""

    request: DispatchRequest


@dataclass(frozen=True)
class Pending:
    """Still queued or running (or not yet found); ``handle`` may have learnt its run id: save it."""

    handle: DispatchHandle
    note: str = ""


@dataclass(frozen=True)
class Finished:
    """The run's artifact verified: a judgement the bot may publish."""

    handle: DispatchHandle
    judgement: Judgement


@dataclass(frozen=True)
class Failed:
    """No verdict from this attempt. ``retry``: worth a run elsewhere; ``alert``: a maintainer must look."""

    handle: DispatchHandle
    reason: str
    infra: bool = True
    retry: bool = False
    alert: bool = False
    retried_as: DispatchHandle | None = None  # set by advance() once it dispatched the retry


Outcome = Pending | Finished | Failed


class ArtifactProblem(Exception):
    """The run's artifact cannot be believed; ``alert`` when it looks forged or misdirected."""

    def __init__(self, reason: str, *, alert: bool = False, retry: bool = False):
        super().__init__(reason)
        self.reason, self.alert, self.retry = reason, alert, retry


# ---------------------------------------------------------------- pure decisions


def workflow_inputs(req: DispatchRequest) -> dict[str, str]:
    """The workflow_dispatch inputs for a request (GitHub takes strings only)."""
    return {
        "pr": str(req.pr),
        "head_sha": req.head_sha,
        "base_sha": req.base_sha,
        "profile": req.profile,
        "request_id": req.request_id,
        "exclude_runner": ",".join(req.exclude_runners),
    }


def names_request(run: WorkflowRun, request_id: str) -> bool:
    """Whether a run is the one dispatched for request_id (its run-name carries the id as a word)."""
    return run.event == "workflow_dispatch" and request_id in run.display_title.split()


def retry_request(failed: Failed) -> DispatchRequest:
    """The next attempt after a failed one: a fresh id, and the failed run's runner excluded if known."""
    req = failed.handle.request
    runner = failed.handle.runner_name
    exclude = req.exclude_runners + ((runner,) if runner and runner not in req.exclude_runners else ())
    return _attempt(req.pr, req.head_sha, req.base_sha, req.profile, req.rules_hash, req.attempt + 1, exclude)


def infra_verdict(rules: Rules, reason: str) -> Verdict:
    """The INFRA_ERROR verdict recorded for an evaluation that produced no believable result."""
    return Verdict(
        Status.INFRA_ERROR,
        None,
        None,
        (),
        (reason,),
        (rules.labels.infra_error,),
        rules_hash=rules.rules_hash,
    )


def trust_problem(receipt: Any, public_keys: tuple[str, ...]) -> str | None:
    """Why the receipt is not signed by one of the runner keys, or None when it is."""
    if not public_keys:
        return "no runner keys are listed in rules/dispatch.yaml: no remote result can be trusted"
    reasons = []
    for key in public_keys:
        result = receipts.verify(receipt, key)
        if result.ok:
            return None
        reasons.append(result.reason)
    if all(r == "signed by a different key" for r in reasons):
        status = receipts.signature_status(receipt)
        return f"receipt {status}, which is none of the runner keys in rules/dispatch.yaml"
    # a reason that does not depend on the key (unsigned, tampered with the right key, malformed)
    return next(r for r in reasons if r != "signed by a different key")


def check_artifact(
    receipt: Mapping[str, Any], result: Mapping[str, Any], req: DispatchRequest, rules: Rules
) -> Judgement:
    """The judgement in a run's receipt and result.json, once it is shown to be signed, about this
    request, and consistent; ArtifactProblem otherwise."""
    why = trust_problem(receipt, rules.dispatch.runner_public_keys)
    if why is not None:
        raise ArtifactProblem(f"receipt not trusted: {why}", alert=True)
    body = receipt["body"]
    if body.get("schema") != receipts.SCHEMA:
        raise ArtifactProblem(
            f"receipt schema is {body.get('schema')!r}, not {receipts.SCHEMA!r}", alert=True
        )
    if "incomplete" in body:
        # the runner stopped before it knew the revisions: nothing in it is bound to this request
        raise ArtifactProblem(f"receipt is incomplete: {body['incomplete']}")
    _check_binding(body, req)
    if body.get("rules_hash") != req.rules_hash:
        raise ArtifactProblem(
            f"receipt was made under rules {str(body.get('rules_hash'))[:12]}, not the requested "
            f"{req.rules_hash[:12]} (main's rules changed under the run?)",
            retry=True,
        )
    if rules.rules_hash != req.rules_hash:
        raise ArtifactProblem(
            f"the bot's rules are now {rules.rules_hash[:12]}, not {req.rules_hash[:12]} as dispatched: "
            "the verdict cannot be checked against the rules it was made under"
        )
    for part in ("measurements", "verdict"):
        if result.get(part) != body.get(part):
            raise ArtifactProblem(f"result.json's {part} differ from the signed receipt's", alert=True)
    try:
        m = from_dict(Measurements, body["measurements"])
        v = from_dict(Verdict, body["verdict"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactProblem(
            f"signed receipt does not hold this bot's Measurements/Verdict: {exc}"
        ) from None
    p = m.provenance
    asked = (req.head_sha, req.base_sha, req.rules_hash, req.profile)
    if (p.head_sha, p.base_sha, p.rules_hash, p.profile) != asked:
        raise ArtifactProblem(
            f"measurements were taken of head {p.head_sha[:12]} vs base {p.base_sha[:12]} with profile "
            f"{p.profile!r}, not what was requested",
            alert=True,
        )
    if p.pr not in (None, req.pr):
        raise ArtifactProblem(f"measurements name PR #{p.pr}, not #{req.pr}", alert=True)
    derived = verdict.decide(m, rules)
    if derived != v:
        raise ArtifactProblem(
            f"signed verdict ({short_verdict(v)}) does not follow from its measurements under these rules "
            f"(they give {short_verdict(derived)})",
            alert=True,
        )
    return Judgement(m, v, dict(receipt))


def _check_binding(body: Mapping[str, Any], req: DispatchRequest) -> None:
    for name in ("head_sha", "base_sha"):
        if body.get(name) != getattr(req, name):
            raise ArtifactProblem(
                f"receipt is for {name} {str(body.get(name))[:12]}, not the requested "
                f"{getattr(req, name)[:12]}",
                alert=True,
            )
    # `evalbot evaluate` leaves pr unset (None); a receipt naming a PR must name this one.
    if body.get("pr") not in (None, req.pr):
        raise ArtifactProblem(f"receipt is for PR #{body.get('pr')}, not #{req.pr}", alert=True)
    extra = body.get("extra")
    if isinstance(extra, Mapping) and "request_id" in extra and extra["request_id"] != req.request_id:
        raise ArtifactProblem(
            f"receipt answers request {extra['request_id']!r}, not {req.request_id!r}", alert=True
        )


def short_verdict(v: Verdict) -> str:
    return f"{v.status.value}{' ' + v.tier if v.tier else ''}"


__all__ = [
    "ARTIFACT_PREFIX",
    "DISCOVERY_S",
    "RECEIPT_FILE",
    "RESULT_FILE",
    "RUN_LIST_LIMIT",
    "ArtifactProblem",
    "DispatchHandle",
    "DispatchRequest",
    "Failed",
    "Finished",
    "Outcome",
    "Pending",
    "RunnerLookup",
    "check_artifact",
    "infra_verdict",
    "names_request",
    "new_request",
    "retry_request",
    "trust_problem",
    "workflow_inputs",
]
