"""The pair design: how many pairs per context a block times (`allocate`: the noisier context gets more) and
how many blocks a pair cap buys (`design`: whole crossovers, each side first equally often)."""

from __future__ import annotations

import math

from evalbot.evaluate.ab_samples import Sample, pairs_at


def allocate(
    samples: list[Sample], contexts: list[int], per_context: int, cap: int | None = None
) -> dict[int, int]:
    """Pairs per context in the next block: `per_context` each at first, then the block's total shared in
    proportion to each context's pair variance (the noisier context gets more), each an even number >= 2
    so both sides go first equally often; with a `cap`, never past `cap` pairs at a context in all."""
    counts = _share(samples, contexts, per_context)
    if cap is None:
        return counts
    return {c: min(n, max(cap - len(pairs_at(samples, c, "decode")[0]), 0)) for c, n in counts.items()}


def _share(samples: list[Sample], contexts: list[int], per_context: int) -> dict[int, int]:
    if per_context == 1:  # one pair a context a block: its order alternates across blocks, nothing to share
        return {c: 1 for c in contexts}
    total = per_context * len(contexts)
    var: dict[int, float] = {}
    for ctx in contexts:
        pairs, _, _ = pairs_at(samples, ctx, "decode")
        if len(pairs) < 4:
            return {c: per_context for c in contexts}
        d = [math.log(h / b) for b, h in pairs]
        mean = sum(d) / len(d)
        var[ctx] = max(sum((x - mean) ** 2 for x in d) / (len(d) - 1), 1e-12)
    weight = sum(var.values())
    return {c: max(2, 2 * round(total * var[c] / weight / 2)) for c in contexts}


def design(pairs_per_block: int, min_blocks: int, cap: int) -> tuple[int, int, int]:
    """(pairs per context per block, most blocks, fewest blocks) for a pair cap per context. A block's
    pairs are even (ABBA within it) but few enough that the cap still buys 4 blocks (the smallest
    crossover, 2 of each load order: 2 blocks leave 1 degree of freedom), one where the cap is that tight
    or where one is asked for (the pair order then alternates across the blocks, with the load order);
    blocks come in whole crossovers, and never more pairs than the cap (2 at the least)."""
    asked = 1 if pairs_per_block <= 1 else 2 * math.ceil(pairs_per_block / 2)
    per_block = max(1, min(asked, 2 * (cap // 8) or cap // 4))
    most = max(2, 2 * (cap // (2 * per_block)))
    return per_block, most, max(2, min(2 * math.ceil(min_blocks / 2), most))
