"""The request bodies, and the two-part request: where main's engine answers the `prefill` op, each request
goes as the prompt's prefill, then a continuation of one token the harness draws only once both sides'
prefills have answered (`continuation`), so that no decode step can be computed before the decode clock
starts (#36). The PR's engine must then answer `prefill` too (`two_part`)."""

from __future__ import annotations

import secrets
from typing import Any

from evalbot.evaluate.ab_samples import SideError
from evalbot.evaluate.served import ServedProcess
from evalbot.model import Side


def generate_body(prompt: list[int], gen: int, stream: str) -> dict[str, Any]:
    """A timed generate request (greedy); `stream` "ends" asks for the first token and then the rest."""
    body: dict[str, Any] = {"op": "generate", "prompt_ids": prompt, "max_new": gen}
    if stream != "token":
        body["stream"] = stream
    return body


def continue_body(token: int, gen: int, stream: str) -> dict[str, Any]:
    """The timed part of a two-part request: the prefilled prompt continued by `token`, then decoded."""
    return {**generate_body([token], gen, stream), "continue": True}


def continuation(procs: dict[Side, ServedProcess]) -> int:
    """The continuation token: drawn by the harness once the prefills have answered, from a source no
    engine can predict (not the seeded prompts), within every side's vocabulary."""
    return secrets.randbelow(min(p.vocab for p in procs.values()))


def two_part(procs: dict[Side, ServedProcess]) -> bool:
    """Whether requests go in two parts: where main's engine lists the `prefill` op in its ready line. The
    PR's must then list it too (SideError, stage 'protocol'): a PR cannot choose the one-part clock."""
    if Side.BASE not in procs or "prefill" not in _ops(procs[Side.BASE]):
        return False
    for side, p in procs.items():
        if "prefill" not in _ops(p):
            raise SideError(
                side,
                "protocol",
                "main's engine answers the 'prefill' op, and this one does not list it in its ready line: "
                "each request is timed as a prefill and a continuation, so that no decode step can run "
                "before the decode clock starts",
            )
    return True


def _ops(p: ServedProcess) -> list[str]:
    ops = p.ready.get("ops")
    return [o for o in ops if isinstance(o, str)] if isinstance(ops, list) else []
