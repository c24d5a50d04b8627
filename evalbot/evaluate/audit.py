"""Every timed token is audited: a random subset of the timed requests, chosen after the runs, is scored
by the reference, teacher-forced on each side's own tokens.

The subset is drawn with a seed made after the last pair (so no engine can know which of its requests
will be checked): at every context, at least a quarter of the pairs and never fewer than 4, both sides'
requests of each chosen pair (they share the prompt, so the reference evaluates it once). A generated
token agrees when it is the reference's top-1 there; a disagreement is tolerated only as a near-tie
(the reference's top-2 margin under the rules' bound). Pure but for `choose`'s seed.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from evalbot.evaluate.ab_samples import Sample
from evalbot.model import DecodeAudit, Side

MAX_LISTED = 10  # disagreements named per audit


def choose(
    samples: Sequence[Sample], rng_seed: int | None = None, *, share: float = 0.25, minimum: int = 4
) -> list[Sample]:
    """The samples to audit: per context, max(minimum, ceil(share * pairs)) pairs (all if fewer), both sides."""
    import random

    rng = random.Random(secrets.randbits(64) if rng_seed is None else rng_seed)
    by_ctx: dict[int, dict[tuple[int, int], list[Sample]]] = {}
    for s in samples:
        by_ctx.setdefault(s.context, {}).setdefault((s.block, s.pair), []).append(s)
    out: list[Sample] = []
    for ctx in sorted(by_ctx):
        pairs = sorted(by_ctx[ctx])
        k = min(len(pairs), max(minimum, math.ceil(share * len(pairs))))
        for key in sorted(rng.sample(pairs, k)):
            out += sorted(by_ctx[ctx][key], key=lambda x: x.side.value)
    return out


def widen(samples: Sequence[Sample], chosen: Sequence[Sample], contexts: Iterable[int]) -> list[Sample]:
    """Every timed request at these contexts that `chosen` left out (both sides of each pair, in order): an
    audit whose tokens could not tell is made of all of them."""
    done = {(s.context, s.block, s.pair, s.side) for s in chosen}
    wanted = set(contexts)
    rest = [s for s in samples if s.context in wanted and (s.context, s.block, s.pair, s.side) not in done]
    return sorted(rest, key=lambda s: (s.context, s.block, s.pair, s.side.value))


def key(s: Sample) -> str:
    """The name of one audited request: side, context, block and pair."""
    return f"{s.side.value}-ctx{s.context}-b{s.block + 1}-p{s.pair + 1}"


def _gaps(answer: Mapping[str, Any], n: int) -> list[float] | None:
    """How far below the reference's top-1 each generated token is (log-probability): the answer's `gap`,
    or its `top1` less its `logprob`; None where the reference gives neither."""
    gap = answer.get("gap")
    if isinstance(gap, list) and len(gap) == n:
        return [float(g) for g in gap]
    top1, lp = answer.get("top1"), answer.get("logprob")
    if isinstance(top1, list) and isinstance(lp, list) and len(top1) == len(lp) == n:
        return [float(t) - float(x) for t, x in zip(top1, lp, strict=True)]
    return None


def judge(
    model: str,
    reference: str,
    chosen: Iterable[Sample],
    answers: Mapping[str, Mapping[str, Any]],
    near_tie: float,
) -> list[DecodeAudit]:
    """Per (side, context): how many generated tokens the reference agrees with, and every disagreement
    that is not a near-tie, named by request, position and margin. A near-tie is a token the reference
    finds within near_tie of its own top-1 (the `gap`, in log-probability; a reference that gives no gap
    falls back to its top-2 margin): with random weights the logits are flat, the top two are always close,
    and a margin rule would excuse any token at all."""
    groups: dict[tuple[Side, int], list[Sample]] = {}
    for s in chosen:
        groups.setdefault((s.side, s.context), []).append(s)
    out = []
    for (side, ctx), samples in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0].value)):
        tokens = agree = ties = 0
        violations: list[dict[str, Any]] = []
        for s in samples:
            a = answers.get(key(s))
            argmax, margin = (a or {}).get("argmax"), (a or {}).get("margin")
            if (
                not isinstance(argmax, list)
                or not isinstance(margin, list)
                or len(argmax) != len(s.tokens)
                or len(margin) != len(s.tokens)
            ):
                raise ValueError(f"the reference gave no answer for {key(s)}")
            gaps = _gaps(a or {}, len(s.tokens))
            for pos, (tok, ref, top2) in enumerate(zip(s.tokens, argmax, margin, strict=True)):
                tokens += 1
                gap = top2 if gaps is None else max(gaps[pos], top2)
                if not math.isfinite(
                    gap
                ):  # NaN (max keeps it) or a broken score: as far past a tie as can be
                    gap = math.inf
                if tok == ref:
                    agree += 1
                elif gap < near_tie:
                    ties += 1
                else:
                    violations.append(
                        {
                            "request": key(s),
                            "position": pos,
                            "token": tok,
                            "reference": ref,
                            "margin": round(float(gap), 4),  # the token's gap below the top-1
                        }
                    )
        violations.sort(key=lambda v: -v["margin"])
        out.append(
            DecodeAudit(
                model,
                ctx,
                side,
                reference,
                len(samples),
                tokens,
                agree,
                ties,
                len(violations),
                tuple(violations[:MAX_LISTED]),
            )
        )
    return out


def requests_file(chosen: Sequence[Sample]) -> str:
    """The reference's input: one {key, prompt, tokens} JSON line per audited request."""
    import json

    return "".join(
        json.dumps({"key": key(s), "prompt": list(s.prompt), "tokens": list(s.tokens)}) + "\n" for s in chosen
    )
