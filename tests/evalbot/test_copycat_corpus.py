"""The copycat detector over the labeled corpus (tests/fixtures/copycat): measured precision and recall.

The corpus is replayed as a timeline through the SQLite index: main snapshots, PRs opened (each is
checked when it opens, then indexed), merged and closed. Re-applied copies are checked again at the
end, after their originals merged. A detection is a copycat block or a containment warning; a tiny
PR's literal-overlap warning asks a maintainer and is not counted as one.

    .venv/bin/python tests/evalbot/test_copycat_corpus.py --sweep   # the k, w table of docs/copycat.md
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import unidiff

from evalbot.copycat.containment import Band, CopycatFinding, PrMeta
from evalbot.copycat.fingerprint import kgram_hashes, normalize
from evalbot.copycat.index import CopycatIndex, check
from evalbot.model import FileChange, PullRequest
from evalbot.rules import Rules, default_rules_dir, load_rules

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "copycat"


@dataclass(frozen=True)
class Outcome:
    case: dict
    finding: CopycatFinding

    @property
    def detected(self) -> bool:
        return self.finding.band is Band.COPYCAT or self.finding.counts_as_warning

    @property
    def correct(self) -> bool:
        if self.case["label"] == "copy":
            return self.detected and self.finding.original == self.case["original"]
        return not self.detected


@dataclass(frozen=True)
class Quality:
    precision: float
    recall: float
    tp: int
    fp: int
    fn: int
    tn: int
    per_kind: dict[str, tuple[int, int]]  # kind -> (correct, cases)


def load_corpus() -> tuple[dict, dict[int, PullRequest]]:
    manifest = json.loads((CORPUS / "cases.json").read_text())
    prs = {}
    for number, meta in manifest["prs"].items():
        files = tuple(
            FileChange(
                f.path,
                "added" if f.is_added_file else "modified",
                f.added,
                f.removed,
                "".join(str(h) for h in f),
            )
            for f in unidiff.PatchSet((CORPUS / meta["patch"]).read_text())
        )
        prs[int(number)] = PullRequest(
            number=int(number),
            author=meta["author"],
            title=meta["title"],
            body="",
            state="closed" if meta["closed_at"] else "open",
            draft=False,
            merged=meta["merged_at"] is not None,
            head_sha="0" * 40,
            base_sha="0" * 40,
            base_ref="main",
            head_ref=f"pr-{number}",
            created_at=meta["created_at"],
            updated_at=meta["created_at"],
            files=files,
            closed_at=meta["closed_at"],
            merged_at=meta["merged_at"],
        )
    return manifest, prs


@functools.lru_cache(maxsize=512)
def _source_kgrams(path: str, text: str, k: int) -> frozenset[int]:
    return frozenset(kgram_hashes([t.text for t in _tokens(path, text)], k))


@functools.lru_cache(maxsize=512)
def _tokens(path: str, text: str):
    return tuple(normalize(path, text))


def as_opened(pr: PullRequest) -> PullRequest:
    """The PR as intake sees it when it opens: not yet merged or closed."""
    return dataclasses.replace(pr, state="open", merged=False, closed_at=None, merged_at=None)


def replay(rules: Rules) -> list[Outcome]:
    """Run the corpus timeline through an in-memory index; one outcome per labeled case."""
    manifest, prs = load_corpus()
    k = rules.copycat.winnowing.k
    index = CopycatIndex.in_memory()
    files: dict[str, str] = {}
    cases = {(c["pr"], c["check"]): c for c in manifest["cases"]}
    out = []
    for event in manifest["events"]:
        if event["type"] == "main":
            files.update(json.loads((CORPUS / event["snapshot"]).read_text()))
            index.set_main(
                frozenset().union(*(_source_kgrams(p, t, k) for p, t in files.items())), event["at"]
            )
        elif event["type"] == "open":
            pr = as_opened(prs[event["pr"]])
            finding, prints = check(index, pr, rules)
            if (pr.number, "open") in cases:
                out.append(Outcome(cases[pr.number, "open"], finding))
            index.add(PrMeta.of(pr), prints)
        elif event["type"] == "merge":
            index.mark_merged(event["pr"], event["at"])
        # a "close" changes nothing: a PR closed unmerged can still be copied
    for (number, when), case in cases.items():
        if when == "end":
            out.append(Outcome(case, check(index, prs[number], rules)[0]))
    return out


def quality(outcomes: list[Outcome]) -> Quality:
    tp = sum(o.case["label"] == "copy" and o.correct for o in outcomes)
    fn = sum(o.case["label"] == "copy" and not o.correct for o in outcomes)
    fp = sum(o.case["label"] == "not_copy" and o.detected for o in outcomes)
    tn = sum(o.case["label"] == "not_copy" and not o.detected for o in outcomes)
    per: dict[str, tuple[int, int]] = {}
    for o in outcomes:
        ok, n = per.get(o.case["kind"], (0, 0))
        per[o.case["kind"]] = (ok + o.correct, n + 1)
    return Quality(
        tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0, tp, fp, fn, tn, per
    )


def with_winnowing(rules: Rules, k: int, w: int) -> Rules:
    cop = dataclasses.replace(rules.copycat, winnowing=dataclasses.replace(rules.copycat.winnowing, k=k, w=w))
    return dataclasses.replace(rules, copycat=cop)


@pytest.fixture(scope="module")
def rules() -> Rules:
    return load_rules(default_rules_dir())


@pytest.fixture(scope="module")
def outcomes(rules) -> list[Outcome]:
    return replay(rules)


def test_corpus_covers_every_case_kind():
    manifest, prs = load_corpus()
    kinds = {c["kind"] for c in manifest["cases"]}
    assert kinds >= {
        "exact_copy", "renamed_reformatted", "junk_interleaved", "partial_copy", "reapplied_after_merge",
        "convergent_tiny_fix", "independent_solution", "boilerplate", "main_code",
    }  # fmt: skip
    assert all(prs[c["pr"]].files for c in manifest["cases"])


def test_precision_and_recall_on_the_corpus(outcomes, rules):
    q = quality(outcomes)
    w = rules.copycat.winnowing
    print(f"\ncopycat corpus (k={w.k}, w={w.w}): precision {q.precision:.3f}, recall {q.recall:.3f} ", end="")
    print(f"(tp {q.tp}, fp {q.fp}, fn {q.fn}, tn {q.tn})")
    for kind, (ok, n) in sorted(q.per_kind.items()):
        print(f"  {kind:24s} {ok}/{n}")
    assert q.precision >= 0.95
    assert q.recall >= 0.95


def test_no_not_copy_is_ever_blocked(outcomes):
    blocked = [
        o.case["pr"] for o in outcomes if o.case["label"] == "not_copy" and o.finding.band is Band.COPYCAT
    ]
    assert blocked == []


def test_exact_partial_and_reapplied_copies_are_blocked_naming_their_original(outcomes):
    for o in outcomes:
        if o.case["kind"] in ("exact_copy", "partial_copy", "reapplied_after_merge"):
            assert o.finding.band is Band.COPYCAT, o.case
            assert o.finding.original == o.case["original"]
            assert o.finding.close and o.finding.strike and o.finding.label == "copycat"


def test_identical_tiny_fixes_go_to_a_maintainer_and_differing_ones_pass(outcomes):
    tiny = [o for o in outcomes if o.case["kind"] == "convergent_tiny_fix" and "other" in o.case]
    assert tiny
    for o in tiny:
        assert o.finding.band is not Band.COPYCAT and not o.finding.counts_as_warning
        if o.finding.literal_overlap >= 0.98:
            assert o.finding.band is Band.WARN and o.finding.original == o.case["other"]
        else:
            assert o.finding.band is Band.CLEAN
    assert {o.finding.band for o in tiny} == {Band.WARN, Band.CLEAN}


def test_main_code_and_boilerplate_are_excluded_not_scored(outcomes):
    main = [o.finding for o in outcomes if o.case["kind"] == "main_code"]
    assert all(f.excluded_main > 0 for f in main)
    later_kernels = [o.finding for o in outcomes if o.case["kind"] == "boilerplate"][-3:]
    assert any(f.excluded_boilerplate > 0 for f in later_kernels)


def sweep(ks: list[int], ws: list[int]) -> None:
    """Print a markdown table of precision and recall over k, w."""
    base = load_rules(default_rules_dir())
    print("| k | w | t = w + k − 1 | precision | recall | missed |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        for w in ws:
            q = quality(replay(with_winnowing(base, k, w)))
            missed = ", ".join(f"{kind} {n - ok}" for kind, (ok, n) in sorted(q.per_kind.items()) if ok < n)
            print(
                f"| {k} | {w} | {w + k - 1} | {q.precision:.3f} | {q.recall:.3f} | {missed or '—'} |",
                flush=True,
            )


if __name__ == "__main__":
    if "--sweep" in sys.argv:
        sweep([6, 8, 10, 12, 13, 14, 16, 20], [2, 4, 6, 8])
