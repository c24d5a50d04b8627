"""copycat: tokenizing and normalizing, the winnowing guarantee, eligibility, exclusions, bands, the index."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalbot.copycat.containment import (
    Band,
    PrMeta,
    assess,
    before,
    check,
    decide,
    gather,
    may_copy_from,
    size_in_lines,
    utc,
)
from evalbot.copycat.fingerprint import (
    _target_lines,
    fingerprint_pr,
    fingerprint_source,
    kgram_hashes,
    line_hash,
    normalize,
    winnow,
)
from evalbot.copycat.index import CopycatIndex
from evalbot.copycat.index import check as index_check
from evalbot.copycat.strikes import prior_warnings, standing
from evalbot.model import FileChange, PullRequest
from evalbot.rules import default_rules_dir, load_rules

SPLIT_SOFTMAX = '''
def split_softmax(scores: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Softmax over the last dim in chunks, so a long row never needs a second full-size buffer."""
    # scores: [..., V] float32
    peak = scores.amax(dim=-1, keepdim=True)
    total = torch.zeros_like(peak)
    for start in range(0, scores.shape[-1], chunk):
        part = scores[..., start : start + chunk]
        total += torch.exp(part - peak).sum(dim=-1, keepdim=True)
    out = torch.empty_like(scores)
    for start in range(0, scores.shape[-1], chunk):
        part = scores[..., start : start + chunk]
        out[..., start : start + chunk] = torch.exp(part - peak) / total
    return out


def top_tokens(scores: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely ids with their probabilities, most likely first."""
    probs = split_softmax(scores.float())
    values, ids = torch.topk(probs, k, dim=-1)
    pairs = []
    for v, i in zip(values.tolist(), ids.tolist()):
        if v <= 0.0:
            break
        pairs.append((int(i), float(v)))
    return pairs
'''

# the same code as an IDE rename and a formatter with other settings leave it
SPLIT_SOFTMAX_DISGUISED = '''
def chunked_softmax(
    logits: torch.Tensor,
    block: int = 4096,
) -> torch.Tensor:
    """Chunked softmax."""
    m = logits.amax(dim=-1, keepdim=True)
    acc = torch.zeros_like(m)
    for s in range(0, logits.shape[-1], block):
        piece = logits[..., s : s + block]
        acc += torch.exp(piece - m).sum(dim=-1, keepdim=True,)
    result = torch.empty_like(logits)
    for s in range(0, logits.shape[-1], block):
        piece = logits[..., s : s + block]
        result[..., s : s + block] = torch.exp(
            piece - m
        ) / acc
    return result


def best_ids(logits: torch.Tensor, n: int) -> list[tuple[int, float]]:
    p = chunked_softmax(logits.float())
    vals, idx = torch.topk(p, n, dim=-1)
    found = []
    for a, b in zip(vals.tolist(), idx.tolist()):
        if a <= 0.0:
            break
        found.append((int(b), float(a)))
    return found
'''

OTHER_CODE = '''
def pad_batch(rows: list[list[int]], pad_id: int, multiple: int = 8) -> tuple[list[list[int]], list[int]]:
    """Right-pad token rows to a common length rounded up to `multiple`; also return the true lengths."""
    lengths = [len(r) for r in rows]
    width = max(lengths, default=0)
    width = -(-width // multiple) * multiple
    padded = [r + [pad_id] * (width - len(r)) for r in rows]
    return padded, lengths


class MovingAverage:
    """Exponential moving average of a scalar, for smoothed throughput in progress lines."""

    def __init__(self, alpha: float = 0.1):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.value = None

    def update(self, x: float) -> float:
        if self.value is None:
            self.value = x
        else:
            self.value = self.alpha * x + (1 - self.alpha) * self.value
        return self.value
'''

T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def added_patch(code: str) -> str:
    lines = code.strip("\n").splitlines()
    return f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)


def make_pr(
    number: int, author: str, hour: int, files: dict[str, str], merged_hour: int | None = None
) -> PullRequest:
    at = (T0 + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
    merged = (
        (T0 + timedelta(hours=merged_hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
        if merged_hour is not None
        else None
    )
    changes = tuple(
        FileChange(path, "added", len(code.strip("\n").splitlines()), 0, added_patch(code))
        for path, code in files.items()
    )
    return PullRequest(
        number, author, f"pr {number}", "", "closed" if merged else "open", False, merged is not None,
        "h", "b", "main", f"b{number}", at, at, files=changes, closed_at=merged, merged_at=merged,
    )  # fmt: skip


def texts(path: str, code: str) -> list[str]:
    return [t.text for t in normalize(path, code)]


# --- tokenizing and normalizing -------------------------------------------------------------------


def test_renaming_reformatting_and_comments_leave_the_normalized_stream_unchanged():
    original = texts("a.py", SPLIT_SOFTMAX.split("\n\n\ndef top_tokens")[0])
    disguised = texts("a.py", SPLIT_SOFTMAX_DISGUISED.split("\n\n\ndef best_ids")[0])
    assert original == disguised
    assert "I" in original and "L" in original and "def" in original and "for" in original
    assert not any(t.startswith("#") or t.isspace() for t in original)


def test_identifiers_and_literals_become_one_class_each():
    assert texts("x.py", 'total = count + 3.5 * len("abc")  # why\n') == [
        "I",
        "=",
        "I",
        "+",
        "L",
        "*",
        "I",
        "(",
        "L",
        ")",
    ]
    assert texts("x.py", 'f"a{b}c" "d"\n') == ["L", "I", "L"]  # implicit concatenation is one literal
    assert texts("x.py", "f(a, b,)\n") == texts("x.py", "f(a, b)\n")  # trailing commas come and go


def test_c_and_cuda_use_their_lexer_keeping_keywords_and_dropping_comments():
    kernel = "#include <cuda.h>\n// scale\n__global__ void k(float* x, int n) { /* c */ x[0] = 2.0f * n; }\n"
    toks = texts("k.cu", kernel)
    assert toks[:3] == ["#", "include", "L"]
    assert "__global__" in toks and "void" in toks and "float" in toks
    assert "//" not in "".join(toks) and "/*" not in "".join(toks)
    assert texts("k.cu", kernel) == texts("k.cuh", kernel)
    assert texts("k.cpp", "int f(int a) { return a + 1; }\n") == [
        "int",
        "I",
        "(",
        "int",
        "I",
        ")",
        "{",
        "return",
        "I",
        "+",
        "L",
        ";",
        "}",
    ]


def test_unknown_file_types_fall_back_to_a_plain_token_split():
    expected = ["I", "=", "I", "(", "L", ",", "L", ")"]
    assert texts("notes.weird", 'foo = bar(3, "x")\n') == expected
    assert texts("notes.txt", 'foo = bar(3, "x")\n') == expected  # pygments' TextLexer gives one blob


def added_lines(path, patch):
    return [(n, t) for n, t, added in _target_lines(path, patch) if added]


def test_added_lines_come_from_unidiff_with_new_file_line_numbers():
    patch = "@@ -10,3 +10,4 @@ def f():\n     a = 1\n-    b = 2\n+    b = 3\n+    c = 4\n     return a\n"
    assert added_lines("m.py", patch) == [(11, "    b = 3"), (12, "    c = 4")]
    full = "--- a/m.py\n+++ b/m.py\n" + patch
    assert added_lines("m.py", full) == added_lines("m.py", patch)
    assert added_lines("m.py", "") == []


def test_fingerprints_are_stable_across_processes():
    # a fixed value: the index keeps these in SQLite, so the hash must never depend on the process
    assert kgram_hashes(["I", "=", "I"], 3) == [kgram_hashes(["I", "=", "I"], 3)[0]]
    assert kgram_hashes(["def", "I", "(", "I", ")"], 5) == [2203030228697162341]
    assert line_hash("  x = 1  ") == line_hash("x = 1")


def test_fingerprint_positions_point_at_added_lines():
    pr = make_pr(1, "a", 0, {"m.py": SPLIT_SOFTMAX})
    fp = fingerprint_pr(pr, 8, 4).files[0]
    assert fp.code_lines == len(
        [x for x in SPLIT_SOFTMAX.strip().splitlines() if x.strip() and not x.strip().startswith("#")]
    )
    lines = {f.line for f in fp.fingerprints}
    assert min(lines) >= 1 and max(lines) <= len(SPLIT_SOFTMAX.strip().splitlines())
    assert [f.position for f in fp.fingerprints] == sorted(f.position for f in fp.fingerprints)


# --- winnowing ---------------------------------------------------------------------------------------


def test_winnowing_takes_the_rightmost_minimum_of_every_window_once():
    assert winnow([5, 3, 4, 3, 9, 8], 3) == [(3, 1), (3, 3)]
    assert winnow([7, 2, 9], 5) == [(2, 1)]  # shorter than a window: one pick
    assert winnow([], 4) == []


WORDS = st.sampled_from(
    ["I", "L", "(", ")", "=", "+", "*", ",", ".", ":", "def", "return", "for", "in", "if"]
)


@settings(max_examples=300, deadline=None)
@given(
    a=st.lists(WORDS, max_size=40),
    b=st.lists(WORDS, max_size=40),
    c=st.lists(WORDS, max_size=40),
    d=st.lists(WORDS, max_size=40),
    shared=st.lists(WORDS, min_size=1, max_size=40),
    k=st.integers(1, 8),
    w=st.integers(1, 8),
)
def test_any_shared_run_of_t_tokens_shares_a_fingerprint(a, b, c, d, shared, k, w):
    t = w + k - 1
    run = (shared * t)[:t] if len(shared) < t else shared
    left, right = a + run + b, c + run + d
    picks_left = {h for h, _ in winnow(kgram_hashes(left, k), w)}
    picks_right = {h for h, _ in winnow(kgram_hashes(right, k), w)}
    assert picks_left & picks_right


# --- eligibility and bands ------------------------------------------------------------------------------


def meta(number, author, hour, merged_hour=None, closed_hour=None):
    at = lambda h: (T0 + timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    return PrMeta(number, author, at(hour), at(merged_hour) if merged_hour is not None else None,
                  at(closed_hour) if closed_hour is not None else None)  # fmt: skip


def test_only_earlier_unmerged_prs_of_other_authors_can_be_copied():
    new = meta(10, "bob", 10)
    assert may_copy_from(new, meta(1, "alice", 1))
    assert may_copy_from(new, meta(2, "alice", 1, closed_hour=5))  # closed unmerged: still copyable
    assert may_copy_from(new, meta(3, "alice", 1, merged_hour=12))  # merged after bob opened: was open then
    assert not may_copy_from(new, meta(4, "alice", 1, merged_hour=9))  # merged before: base code
    assert not may_copy_from(new, meta(5, "Bob", 1))  # the author's own PR
    assert not may_copy_from(new, meta(6, "alice", 11))  # opened later
    assert not may_copy_from(new, new)


def test_bands_follow_the_rules(rules):
    cfg = rules.copycat
    block = decide(40, 40, cfg.containment.block, 0.0, cfg)
    assert block.band is Band.COPYCAT and block.close and block.strike and block.skip_evaluation
    warn = decide(40, 40, cfg.containment.warn, 0.0, cfg)
    assert warn.band is Band.WARN and warn.skip_evaluation and warn.counts_as_warning and not warn.close
    assert decide(40, 40, cfg.containment.warn - 0.01, 0.0, cfg).band is Band.CLEAN
    third = decide(40, 40, cfg.containment.warn, 0.0, cfg, prior_warnings=cfg.warnings_to_block - 1)
    assert third.band is Band.COPYCAT and third.strike


def test_tiny_prs_are_never_blocked_and_identical_ones_go_to_a_maintainer(rules):
    cfg = rules.copycat
    tiny = cfg.tiny_pr.below_added_lines - 1
    assert decide(tiny, tiny, 1.0, 0.5, cfg).band is Band.CLEAN
    review = decide(tiny, tiny, 1.0, cfg.tiny_pr.warn_literal_overlap, cfg)
    assert review.band is Band.WARN and not review.counts_as_warning and not review.skip_evaluation
    assert decide(40, tiny, 1.0, 1.0, cfg).band is Band.CLEAN  # its own part after exclusions is tiny


def test_joining_lines_does_not_make_a_pr_tiny():
    one_line = "def f(a, b, c, d): return [a + b * c - d for a in range(b) if a % c == d] + [a, b] * 2\n"
    pr = fingerprint_pr(make_pr(1, "a", 0, {"m.py": one_line * 3}), 8, 4)
    assert pr.code_lines == 3 and size_in_lines(pr) >= pr.tokens // 10 > 3


# --- whole checks: copies, exclusions, per-file scores ----------------------------------------------------


def test_a_renamed_reformatted_copy_is_blocked_and_names_its_original(rules):
    alice = make_pr(1, "alice", 0, {"engine/softmax.py": SPLIT_SOFTMAX})
    carol = make_pr(2, "carol", 1, {"engine/pad.py": OTHER_CODE})
    bob = make_pr(3, "bob", 2, {"engine/probs.py": SPLIT_SOFTMAX_DISGUISED})
    found = check(bob, [alice, carol], frozenset(), rules)
    assert found.band is Band.COPYCAT and found.original == 1 and found.score >= 0.85
    assert found.label == rules.labels.copycat and "original: #1" in found.reasons
    assert check(carol, [alice], frozenset(), rules).band is Band.CLEAN
    assert check(alice, [bob, carol], frozenset(), rules).band is Band.CLEAN  # bob is later


def test_per_file_scores_separate_the_copied_file_from_the_own_one(rules):
    alice = make_pr(1, "alice", 0, {"engine/softmax.py": SPLIT_SOFTMAX})
    bob = make_pr(2, "bob", 1, {"engine/a.py": SPLIT_SOFTMAX, "engine/b.py": OTHER_CODE})
    found = check(bob, [alice], frozenset(), rules)
    scores = {f.path: f.containment for f in found.per_file}
    assert scores["engine/a.py"] == 1.0 and scores["engine/b.py"] < 0.2
    assert found.band is Band.CLEAN and 0.3 < found.score < 0.75


def test_code_already_on_main_is_excluded_before_comparing(rules):
    k = rules.copycat.winnowing.k
    main = fingerprint_source("engine/softmax.py", SPLIT_SOFTMAX, k)
    alice = make_pr(1, "alice", 0, {"engine/x.py": SPLIT_SOFTMAX})
    bob = make_pr(2, "bob", 1, {"engine/y.py": SPLIT_SOFTMAX_DISGUISED})
    found = check(bob, [alice], main, rules)
    # what is left are the k-grams the disguise itself changed (a dropped docstring)
    assert found.band is Band.CLEAN and found.excluded_main > 5 * found.fingerprints
    assert check(bob, [alice], frozenset(), rules).band is Band.COPYCAT


def test_merged_code_is_base_for_prs_opened_after_the_merge_only(rules):
    alice_merged_early = make_pr(1, "alice", 0, {"engine/x.py": SPLIT_SOFTMAX}, merged_hour=1)
    bob = make_pr(2, "bob", 2, {"engine/y.py": SPLIT_SOFTMAX})
    found = check(bob, [alice_merged_early], frozenset(), rules)
    assert found.band is Band.CLEAN and found.excluded_merged > 0 and found.fingerprints == 0
    alice_merged_late = make_pr(1, "alice", 0, {"engine/x.py": SPLIT_SOFTMAX}, merged_hour=5)
    again = check(bob, [alice_merged_late], frozenset(), rules)  # bob copied while it was open
    assert again.band is Band.COPYCAT and again.original == 1


def test_fingerprints_in_more_than_n_prs_are_boilerplate(rules):
    n = rules.copycat.boilerplate_max_prs
    scaffold = {"kernels/common.py": SPLIT_SOFTMAX}
    many = [make_pr(i, f"dev{i}", i, scaffold) for i in range(1, n + 2)]
    bob = make_pr(50, "bob", 60, {"kernels/mine.py": SPLIT_SOFTMAX + "\n\n" + OTHER_CODE})
    found = check(bob, many, frozenset(), rules)
    assert found.excluded_boilerplate > 0 and found.band is Band.CLEAN
    few = check(bob, many[:n], frozenset(), rules)  # held by n PRs: not yet boilerplate
    assert few.excluded_boilerplate == 0 and few.score > found.score


def test_an_author_reopening_their_own_code_is_not_a_copy_of_its_copier(rules):
    alice = make_pr(1, "alice", 0, {"engine/x.py": SPLIT_SOFTMAX})
    bob = make_pr(2, "bob", 1, {"engine/y.py": SPLIT_SOFTMAX})
    alice_again = make_pr(3, "alice", 2, {"engine/x.py": SPLIT_SOFTMAX})
    assert check(alice_again, [alice, bob], frozenset(), rules).band is Band.CLEAN
    assert check(bob, [alice], frozenset(), rules).band is Band.COPYCAT


# --- the SQLite index ------------------------------------------------------------------------------------


def index_with(prs, rules, main=frozenset(), main_at="2026-01-01T00:00:00Z"):
    index = CopycatIndex.in_memory()
    index.set_main(main, main_at)
    for pr in prs:
        index.add(PrMeta.of(pr), fingerprint_pr(pr, rules.copycat.winnowing.k, rules.copycat.winnowing.w))
    return index


def test_the_index_gives_the_same_findings_as_the_in_memory_scan(rules):
    k, w = rules.copycat.winnowing.k, rules.copycat.winnowing.w
    prs = [
        make_pr(1, "alice", 0, {"engine/softmax.py": SPLIT_SOFTMAX}),
        make_pr(2, "carol", 1, {"engine/pad.py": OTHER_CODE}, merged_hour=2),
        make_pr(3, "bob", 3, {"engine/probs.py": SPLIT_SOFTMAX_DISGUISED, "engine/pad2.py": OTHER_CODE}),
        make_pr(4, "dave", 4, {"engine/z.py": SPLIT_SOFTMAX_DISGUISED}),
    ]
    index = index_with(prs, rules)
    for pr in prs:
        others = [o for o in prs if o.number != pr.number]
        memory = check(pr, others, frozenset(), rules)
        stored, _ = index_check(index, pr, rules)
        assert stored == memory, pr.number
    new = fingerprint_pr(prs[3], k, w)
    evidence = gather(
        new, PrMeta.of(prs[3]), [(PrMeta.of(o), fingerprint_pr(o, k, w)) for o in prs[:3]], frozenset(), 5
    )
    assert assess(new, PrMeta.of(prs[3]), evidence, rules).original == 3  # dave's text is bob's disguise


def test_candidates_count_shared_fingerprints_per_earlier_pr(rules):
    k, w = rules.copycat.winnowing.k, rules.copycat.winnowing.w
    alice = make_pr(1, "alice", 0, {"a.py": SPLIT_SOFTMAX})
    carol = make_pr(2, "carol", 1, {"c.py": OTHER_CODE})
    index = index_with([alice, carol], rules)
    probe = fingerprint_pr(make_pr(3, "bob", 2, {"b.py": SPLIT_SOFTMAX}), k, w).hashes
    counts = index.candidates(probe, boilerplate_max_prs=5, before=utc("2026-11-01T02:00:00Z"))
    assert counts == {1: len(probe & fingerprint_pr(alice, k, w).hashes)}
    assert index.candidates(probe, boilerplate_max_prs=5, before=utc("2026-11-01T00:00:00Z")) == {}
    assert index.document_frequency(probe, cap=10) == dict.fromkeys(probe, 1)


def test_re_adding_a_pr_replaces_its_fingerprints_and_state_changes_are_kept(rules):
    k, w = rules.copycat.winnowing.k, rules.copycat.winnowing.w
    first = make_pr(1, "alice", 0, {"a.py": SPLIT_SOFTMAX})
    index = index_with([first], rules)
    pushed = make_pr(1, "alice", 0, {"a.py": OTHER_CODE})
    index.add(PrMeta.of(pushed), fingerprint_pr(pushed, k, w))
    assert index.candidates(fingerprint_pr(first, k, w).hashes, 5) == {}
    assert index.candidates(fingerprint_pr(pushed, k, w).hashes, 5)
    bob = make_pr(2, "bob", 3, {"b.py": OTHER_CODE})
    index.mark_merged(1, "2026-11-01T02:00:00Z")  # merged before bob opened: base code now
    found, _ = index_check(index, bob, rules)
    assert found.band is Band.CLEAN and found.excluded_merged > 0


def test_main_kgrams_count_from_the_time_they_appeared(rules):
    k = rules.copycat.winnowing.k
    alice = make_pr(1, "alice", 0, {"a.py": SPLIT_SOFTMAX})
    bob = make_pr(2, "bob", 2, {"b.py": SPLIT_SOFTMAX_DISGUISED})
    index = index_with([alice], rules)
    # alice's change lands on main after bob opened: bob still copied it while it was open
    index.mark_merged(1, "2026-11-01T05:00:00Z")
    index.set_main(fingerprint_source("a.py", SPLIT_SOFTMAX, k), "2026-11-01T05:00:00Z")
    found, _ = index_check(index, bob, rules)
    assert found.band is Band.COPYCAT and found.original == 1
    late = make_pr(3, "carol", 6, {"c.py": SPLIT_SOFTMAX})
    found, _ = index_check(index, late, rules)
    assert found.band is Band.CLEAN and found.excluded_main > 0


def test_index_lookups_never_scan_all_postings(rules):
    """Every query a check runs (the store's own SQL, traced) reads postings, lines, main and PRs by key."""
    from evalbot.store import Store

    store = Store.in_memory()
    index = CopycatIndex(store.copycat)
    fix = "    out = torch.zeros(n, dtype=torch.long, device=self.model.device)\n    out.fill_(pad_id)\n"
    index.set_main({1, 2}, "2026-01-01T00:00:00Z")
    for pr in (make_pr(1, "alice", 0, {"a.py": SPLIT_SOFTMAX}), make_pr(2, "alice", 0, {"g.py": fix})):
        index.add(PrMeta.of(pr), fingerprint_pr(pr, rules.copycat.winnowing.k, rules.copycat.winnowing.w))
    traced: list[str] = []
    store.db._conn.set_trace_callback(traced.append)
    for pr in (make_pr(3, "bob", 1, {"b.py": SPLIT_SOFTMAX}), make_pr(4, "bob", 1, {"h.py": fix})):
        index_check(index, pr, rules)  # a normal PR and a tiny one: both literal paths
    store.db._conn.set_trace_callback(None)
    selects = sorted({sql for sql in traced if sql.lstrip().upper().startswith("SELECT")})
    assert len(selects) >= 6, selects  # main, frequencies, postings, PRs, rarest line, its PRs, shared lines
    for sql in selects:
        plan = " ".join(row[-1] for row in store.db.read("EXPLAIN QUERY PLAN " + sql))
        assert not any(f"SCAN {t}" in plan for t in ("p", "m", "l", "copycat")), (sql, plan)


def test_a_tiny_identical_fix_is_found_by_its_rarest_line(rules):
    fix = "    out = torch.zeros(n, dtype=torch.long, device=self.model.device)\n    out.fill_(pad_id)\n"
    alice = make_pr(1, "alice", 0, {"engine/generate.py": fix})
    bob = make_pr(2, "bob", 1, {"engine/generate.py": fix})
    index = index_with([alice], rules)
    found, _ = index_check(index, bob, rules)
    assert found.band is Band.WARN and found.original == 1 and found.literal_overlap == 1.0
    assert not found.counts_as_warning and not found.close


# --- strikes ------------------------------------------------------------------------------------------------


def test_strikes_reaching_the_limit_within_the_window_blocklist_and_freeze(rules):
    cfg = rules.copycat
    day = timedelta(days=1)
    spread = [T0 + i * (cfg.strikes.window_days + 1) * day for i in range(cfg.strikes.limit)]
    now = spread[-1] + day
    loose = standing(spread, now, cfg)
    assert not loose.blocklisted and loose.frozen_until is None and not loose.frozen(now)
    close = [T0 + i * day for i in range(cfg.strikes.limit)]
    tight = standing(close, close[-1] + day, cfg)
    assert tight.blocklisted and tight.strikes_in_window == cfg.strikes.limit
    assert tight.frozen_until == close[-1] + cfg.strikes.window_days * day
    assert tight.frozen(close[-1] + day) and not tight.frozen(tight.frozen_until)
    assert not standing(close, close[-2], cfg).blocklisted  # the limit-th strike has not happened yet
    assert prior_warnings(close, close[-1] + day, cfg) == cfg.strikes.limit
    assert prior_warnings(close, close[-1] + cfg.strikes.window_days * day * 2, cfg) == 0


def test_times_are_compared_in_utc():
    assert utc("2026-11-30T12:00:00+02:00") == "2026-11-30T10:00:00.000000Z"  # the one text form
    assert utc("2026-11-30T10:00:00Z") == utc("2026-11-30T10:00:00.000000+00:00")
    assert before("2026-11-30T10:00:00Z", "2026-11-30T09:59:59-00:01")  # compared as times, not text
    assert before("2026-11-30T10:30:00+01:00", "2026-11-30T09:31:00Z")  # 09:30Z, though its text sorts later
    pr = make_pr(1, "a", 0, {"m.py": OTHER_CODE})
    assert PrMeta.of(dataclasses.replace(pr, created_at="2026-11-01T01:00:00+01:00")).created_at == utc(
        pr.created_at
    )


def test_every_reader_of_times_shares_one_parser():
    """copycat, the dashboard and the site read times through evalbot.times: the same text, the same moment."""
    from evalbot import render, times
    from evalbot.dashboard.data import parse_time

    for text in ("2026-11-30T12:00:00+02:00", "2026-11-30T10:00:00Z", "2026-11-30T10:00:00"):
        assert times.parse(utc(text)) == parse_time(text) == times.parse("2026-11-30T10:00:00Z")
        assert render.site_time(text) == "2026-11-30 10:00 UTC"
    assert parse_time("yesterday") is None and render.site_time("yesterday") == "yesterday"
    with pytest.raises(ValueError, match="without a zone"):
        times.parse("2026-11-30T10:00:00")  # the store's own times must carry a zone
