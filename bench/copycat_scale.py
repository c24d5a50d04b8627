"""Copycat at scale: one check against an index of 10,000 earlier PRs, in a SQLite file on disk.

Earlier PRs are 50-400 added lines each, made of runs of 1-6 consecutive lines drawn from this
repository's Python (engine/, kernels/, evalbot/), with one normalized token changed on about half
of the lines so that PRs differ the way separate contributions do. They are indexed from their
normalized token streams with the detector's own hashing and winnowing (lexing 2 M lines with
pygments would take minutes and is not what is timed). One of them, #5000, is real patch text,
indexed through the whole pipeline. Main holds the k-grams of engine/ and kernels/. The index is built
through the bot's own store (one durable transaction per PR, as the bot writes it), so ``build_s`` includes
an fsync per PR.

Timed (median of --repeats, after one warm-up, on a fresh connection; the OS cache is warm): the whole
check of a PR from its patch text (unidiff, pygments, winnowing, index lookups, decision), for a copy
of #5000 and for new PRs of each --check-lines size; and the index lookups alone. Prints one JSON object.

    .venv/bin/python bench/copycat_scale.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalbot.copycat import CopycatIndex, PrMeta, check  # noqa: E402
from evalbot.copycat.fingerprint import (  # noqa: E402
    FilePrint,
    Fingerprint,
    PrPrint,
    fingerprint_pr,
    fingerprint_source,
    kgram_hashes,
    line_hash,
    normalize,
    winnow,
)
from evalbot.model import FileChange, PullRequest  # noqa: E402
from evalbot.rules import default_rules_dir, load_rules  # noqa: E402
from evalbot.store import Store  # noqa: E402

MUTATIONS = ["+", "-", "*", "/", "<", ">", "==", "(", ")", ",", ".", "I", "L", "if", "return", "not", "in"]


def pool() -> tuple[list[str], list[list[str]]]:
    """Code lines of the repository's Python and each line's normalized tokens."""
    lines: list[str] = []
    tokens: list[list[str]] = []
    for path in sorted(
        [*ROOT.glob("engine/*.py"), *ROOT.glob("kernels/*.py"), *ROOT.glob("evalbot/**/*.py")]
    ):
        text = path.read_text()
        per_line: dict[int, list[str]] = {}
        for t in normalize(path.name, text):
            per_line.setdefault(t.line, []).append(t.text)
        for i, raw in enumerate(text.splitlines()):
            if i in per_line:
                lines.append(raw)
                tokens.append(per_line[i])
    return lines, tokens


def runs(rng: random.Random, size: int, n_lines: int) -> list[int]:
    """Indices of `n_lines` pool lines taken as runs of 1-6 consecutive lines from random places."""
    out: list[int] = []
    while len(out) < n_lines:
        start = rng.randrange(size - 6)
        out.extend(range(start, start + rng.randint(1, 6)))
    return out[:n_lines]


def synthetic_print(rng: random.Random, lines: list[str], tokens: list[list[str]], k: int, w: int) -> PrPrint:
    """A PR's prints from pool lines, one token changed on about half of them."""
    stream: list[str] = []
    literal = set()
    line_of: list[int] = []
    for n, i in enumerate(runs(rng, len(lines), rng.randint(50, 400))):
        toks = list(tokens[i])
        raw = lines[i]
        if rng.random() < 0.5:
            toks[rng.randrange(len(toks))] = rng.choice(MUTATIONS)
            raw = f"{raw}  # {rng.random()}"
        stream.extend(toks)
        line_of.extend([n] * len(toks))
        literal.add(line_hash(raw))
    picks = winnow(kgram_hashes(stream, k), w)
    fps = tuple(Fingerprint(h, p, line_of[p]) for h, p in picks)
    return PrPrint((FilePrint("engine/x.py", len(set(line_of)), len(stream), fps, frozenset(literal)),))


def patch_pr(number: int, author: str, created: str, text: str) -> PullRequest:
    """An open PR adding `text` as a new file."""
    body = text.splitlines()
    patch = f"@@ -0,0 +1,{len(body)} @@\n" + "".join(f"+{line}\n" for line in body)
    change = FileChange("engine/feature.py", "added", len(body), 0, patch)
    return PullRequest(
        number,
        author,
        "bench",
        "",
        "open",
        False,
        False,
        "h",
        "b",
        "main",
        "f",
        created,
        created,
        files=(change,),
    )


def main() -> None:
    """Build the index, time the checks, print the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prs", type=int, default=10_000)
    ap.add_argument("--check-lines", type=int, nargs="+", default=[225, 50, 1000])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rules = load_rules(default_rules_dir())
    k, w = rules.copycat.winnowing.k, rules.copycat.winnowing.w
    rng = random.Random(args.seed)
    lines, tokens = pool()
    real = "\n".join(lines[i] for i in runs(rng, len(lines), args.check_lines[0])) + "\n"
    fresh = {n: "\n".join(lines[i] for i in runs(rng, len(lines), n)) + "\n" for n in args.check_lines}
    main_kgrams = frozenset().union(
        *(
            fingerprint_source(p.name, p.read_text(), k)
            for p in [*ROOT.glob("engine/*.py"), *ROOT.glob("kernels/*.py")]
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "copycat.sqlite"
        store = Store(db)  # the bot's own store: WAL, synchronous=FULL, one transaction per indexed PR
        index = CopycatIndex(store.copycat)
        t0 = time.perf_counter()
        index.set_main(main_kgrams, "2026-01-01T00:00:00Z")
        postings = 0
        for n in range(1, args.prs + 1):
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_767_225_600 + n * 600))
            if n == args.prs // 2:
                prints = fingerprint_pr(patch_pr(n, f"dev{n}", created, real), k, w)
            else:
                prints = synthetic_print(rng, lines, tokens, k, w)
            postings += len(prints.hashes)
            index.add(PrMeta(n, f"dev{n}", created), prints)
        build_s = time.perf_counter() - t0
        store.close()

        store = Store(db)
        index = CopycatIndex(store.copycat)
        later = "2026-12-01T00:00:00Z"
        prs = {"copy": patch_pr(args.prs + 1, "copier", later, real)}
        for i, (n, text) in enumerate(fresh.items()):
            prs[f"new_{n}"] = patch_pr(args.prs + 2 + i, f"newcomer{i}", later, text)
        timings: dict[str, list[float]] = {name: [] for name in [*prs, "lookups"]}
        found = {}
        copy_prints = fingerprint_pr(prs["copy"], k, w)
        for _ in range(args.repeats + 1):
            for name, pr in prs.items():
                t = time.perf_counter()
                found[name] = check(index, pr, rules)[0]
                timings[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            index.evidence(copy_prints, PrMeta.of(prs["copy"]), rules.copycat.boilerplate_max_prs, 15)
            timings["lookups"].append(time.perf_counter() - t)
        size_mb = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6
        store.close()
    out = {
        "prs": args.prs,
        "postings": postings,
        "db_mb": round(size_mb, 1),
        "build_s": round(build_s, 1),
        "k": k,
        "w": w,
        "repeats": args.repeats,
        "check_median_s": {name: round(statistics.median(t[1:]), 4) for name, t in timings.items()},
        "check_lines": {name: pr.files[0].additions for name, pr in prs.items()},
        "copy_fingerprints": len(copy_prints.hashes),
        "bands": {name: [f.band.value, f.original] for name, f in found.items()},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
