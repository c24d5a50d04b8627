"""Speculative decoding: a drafter proposes up to B-1 tokens, the target checks them in one pass.

The output is the target's own: under greedy decoding the longest prefix of drafts that matches the
target's argmax is kept and the target's next token is added; under sampling, drafts go through
rejection sampling (Leviathan et al., 2023), so the output distribution is exactly the target's.
Both KV caches are rolled back to the committed length after every verify step.

Cache convention: every cache holds all committed tokens but the last one (the "pending" token, whose
logits are computed by the next forward pass). τ (``mean_accept``) = tokens committed per verify step.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.generate import Session
from engine.sampling import SamplingParams, make_generator, probabilities, sample

DEFAULT_BLOCK = 7  # most tokens committed per target pass: 6 drafted + 1 from the target, as in the seeds


class Drafter(Protocol):
    """Proposes continuations of the committed tokens."""

    name: str

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a new sequence (prefill a draft model, index a prompt)."""

    def propose(
        self, committed: Sequence[int], k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to k draft tokens, and their draft distributions [len, V] (None: deterministic, one-hot)."""

    def commit(self, committed: Sequence[int]) -> None:
        """Drop state past the committed tokens (the rollback after a verify step)."""


class NgramDrafter:
    """Prompt lookup: continue the most recent earlier occurrence of the longest suffix (≤ n tokens)."""

    def __init__(self, n: int = 3):
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.name = f"ngram-{n}"

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(
        self, committed: Sequence[int], k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        return lookup(committed, self.n, k), None

    def commit(self, committed: Sequence[int]) -> None:
        pass


def lookup(tokens: Sequence[int], n: int, k: int) -> list[int]:
    """The k tokens after the latest earlier match of the longest suffix of length n..1 (may be fewer)."""
    if k <= 0:
        return []
    seq = list(tokens)
    last = len(seq)
    for size in range(min(n, last - 1), 0, -1):
        suffix = seq[last - size :]
        # scan right to left: the most recent occurrence best predicts what comes next
        for start in range(last - size - 1, -1, -1):
            if seq[start : start + size] == suffix:
                cont = seq[start + size : start + size + k]
                if cont:
                    return cont
    return []


class DraftModelDrafter:
    """A smaller model with the same tokenizer, drafting with its own KV cache."""

    def __init__(self, session: Session):
        self.session = session
        self.name = "draft-model"

    def begin(self, prompt: Sequence[int]) -> None:
        self.session.reset()
        if len(prompt) > 1:
            self.session.forward(prompt[:-1])

    def propose(
        self, committed: Sequence[int], k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        if k <= 0:
            return [], None
        s = self.session
        logits = s.forward(list(committed[s.length :]))  # catch up: the pending token, plus any new ones
        drafts: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits[None], params)[0]
                token = int(torch.multinomial(q, 1, generator=gen))
                qs.append(q)
            drafts.append(token)
            if i + 1 < k:
                logits = s.forward([token])
        return drafts, (torch.stack(qs) if qs else None)

    def commit(self, committed: Sequence[int]) -> None:
        self.session.cache.truncate(min(self.session.length, len(committed) - 1))


# A verifier maps (target logits [k+1, V], drafts, draft probs, params, generator) to
# (number of drafts accepted, the token the target adds). Pluggable so that tests can prove that a
# wrong one is caught by the lossless check.
Verifier = Callable[
    [torch.Tensor, list[int], "torch.Tensor | None", SamplingParams, "torch.Generator | None"],
    tuple[int, int],
]


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """Accept the longest prefix of drafts equal to the target's argmax, then the target's own next token."""
    # logits: [k+1, V]; row i predicts the token after drafts[:i]
    best = logits.argmax(-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == best[n]:
        n += 1
    return n, best[n]


def verify_sampling(
    p: torch.Tensor, drafts: list[int], q: torch.Tensor | None, gen: torch.Generator | None
) -> tuple[int, int]:
    """Rejection sampling against the target's distributions p [k+1, V] (after temperature/top-k/top-p):
    accept x with prob min(1, p(x)/q(x)); on rejection draw from norm(max(p - q, 0))."""
    for i, x in enumerate(drafts):
        q_i = q[i] if q is not None else None
        qx = float(q_i[x]) if q_i is not None else 1.0  # an n-gram draft is one-hot
        px = float(p[i, x])
        r = float(torch.rand((), generator=gen))
        if qx > 0 and r < min(1.0, px / qx):
            continue
        if q_i is not None:
            residual = (p[i] - q_i).clamp_min(0)
        else:
            residual = p[i].clone()
            residual[x] = 0.0
        total = float(residual.sum())
        if total <= 0:  # p == q exactly: a rejection has probability 0, so this is unreachable in exact math
            residual, total = p[i], 1.0
        return i, int(torch.multinomial(residual / total, 1, generator=gen))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=gen))


def default_verifier(
    logits: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    params: SamplingParams,
    gen: torch.Generator | None,
) -> tuple[int, int]:
    """Greedy prefix match at temperature 0, rejection sampling otherwise."""
    if params.greedy:
        return verify_greedy(logits, drafts)
    return verify_sampling(probabilities(logits, params), drafts, q, gen)


@dataclass
class SpecGeneration:
    """Tokens produced speculatively, with acceptance statistics and timings (prefill excluded)."""

    token_ids: list[int] = field(default_factory=list)
    accept_hist: Counter[int] = field(default_factory=Counter)  # tokens committed per verify step -> count
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def steps(self) -> int:
        return sum(self.accept_hist.values())

    @property
    def mean_accept(self) -> float:
        """τ: tokens committed per verify step (1 <= τ <= B)."""
        return sum(k * v for k, v in self.accept_hist.items()) / self.steps if self.steps else 0.0


def speculative_generate(
    target: Session,
    drafter: Drafter,
    prompt: Sequence[int],
    max_new: int,
    block_size: int = DEFAULT_BLOCK,
    params: SamplingParams | None = None,
    stop_ids: frozenset[int] = frozenset(),
    verifier: Verifier = default_verifier,
    on_step: Callable[[list[int]], None] | None = None,
) -> SpecGeneration:
    """Generate max_new tokens with the target, B-1 drafted tokens checked per target forward pass.
    `on_step` receives the tokens each step commits, the prefill's first token as a step of its own."""
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    if len(prompt) + max_new > target.max_seq:
        raise ValueError(f"prompt {len(prompt)} + {max_new} new tokens exceed the cache ({target.max_seq})")
    params = params or SamplingParams()
    gen = None if params.greedy else make_generator(params)
    out = SpecGeneration()
    target.reset()
    target._sync()
    t0 = time.perf_counter()
    logits = target.forward(prompt)
    first = int(sample(logits[None], params, gen)[0])
    drafter.begin(prompt)
    target._sync()
    t1 = time.perf_counter()
    out.prefill_s = t1 - t0
    committed = [*prompt, first]
    new = [first]
    if on_step:
        on_step([first])
    while len(new) < max_new and new[-1] not in stop_ids:
        k = min(block_size - 1, max_new - len(new) - 1)  # never draft past the requested length
        drafts, q = drafter.propose(committed, k, params, gen)
        drafts = drafts[:k]
        logits = target.forward([committed[-1], *drafts], all_logits=True)  # [1 + len(drafts), V]
        n_ok, extra = verifier(logits, drafts, q, params, gen)
        step = [*drafts[:n_ok], extra]
        out.accept_hist[len(step)] += 1
        committed += step
        new += step
        target.cache.truncate(len(committed) - 1)
        drafter.commit(committed)
        if stop_ids and any(t in stop_ids for t in step):
            cut = next(i for i, t in enumerate(new) if t in stop_ids)
            if on_step:
                on_step(step[: len(step) - (len(new) - cut - 1)])
            new = new[: cut + 1]
            break
        if on_step:
            on_step(step)
    target._sync()
    out.decode_s = time.perf_counter() - t1
    out.token_ids = new[:max_new]
    return out


@dataclass(frozen=True)
class LosslessReport:
    """Whether speculative runs reproduced the autoregressive tokens exactly."""

    lossless: int  # 1 only when every run equals the AR tokens
    lossless_runs: int
    runs: int
    first_divergence: int | None  # earliest index where any run differs (None when lossless)


def lossless_report(ar_tokens: Sequence[int], spec_runs: Sequence[Sequence[int]]) -> LosslessReport:
    """Token-exact comparison of every speculative run against the AR reference."""
    firsts = []
    for run in spec_runs:
        if list(run) == list(ar_tokens):
            continue
        diff = next(
            (i for i, (a, b) in enumerate(zip(ar_tokens, run, strict=False)) if a != b),
            min(len(ar_tokens), len(run)),
        )
        firsts.append(diff)
    ok = len(spec_runs) - len(firsts)
    return LosslessReport(
        int(not firsts and bool(spec_runs)), ok, len(spec_runs), min(firsts) if firsts else None
    )
