"""Summarize the #36 A/A runs: per run the scored metric's ratio, CI and MDE at each context, the verdict."""

import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]
rows = {"new": [], "old": []}
for d in sorted(glob.glob(f"{out}/*-*/"), key=lambda p: int(os.path.basename(p.rstrip("/")).split("-")[0])):
    name = os.path.basename(d.rstrip("/"))
    i, tag = name.split("-")
    try:
        j = json.load(open(f"{d}/aa1.json"))
    except (OSError, ValueError):
        print(f"| {i} | {tag} | (no result) |")
        continue
    err = open(f"{d}/aa1.err").read()
    verdict = re.findall(r"calibration run 1/1: (\w+)", err)
    blocks = re.findall(r"A/B done after (\d+) blocks \((\d+) s\)", err)
    cells = []
    for r in j["rows"]:
        det = r["details"]
        lo, hi = det["ci"][0]
        cells.append(f"{det['ratios'][0]:.4f}x [{lo:.4f}, {hi:.4f}], {r['mde']:.2%} ({det['metric']})")
        rows[tag].append((r["context"], r["mde"], det["false_positives"], det["failed_runs"]))
    print(
        f"| {i} | {tag} `{j['rev'][:7] if isinstance(j.get('rev'), str) else ''}` | "
        + " | ".join(cells)
        + f" | {blocks[-1][0] + ' blocks, ' + blocks[-1][1] + ' s' if blocks else ''} | {verdict[-1] if verdict else '?'} |"
    )
for tag, rs in rows.items():
    for ctx in (128, 512):
        m = [x[1] for x in rs if x[0] == ctx]
        if m:
            print(
                f"{tag} ctx {ctx}: {len(m)} runs, median MDE {statistics.median(m):.2%}, max {max(m):.2%}, "
                f"false {sum(x[2] for x in rs if x[0] == ctx)}, failed {sum(x[3] for x in rs if x[0] == ctx)}"
            )
