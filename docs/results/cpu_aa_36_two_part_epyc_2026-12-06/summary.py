"""Summarize the two-part clock A/A runs: ratio, CI and MDE per context, the verdict (#36 part 4)."""

import json
import re
import statistics
import sys

d = sys.argv[1]
mdes = {128: [], 512: []}
print("| run | ctx 128: ratio [95% CI], MDE | ctx 512: ratio [95% CI], MDE | A/B | verdict |")
print("|--:|---|---|---|---|")
for i in range(1, 6):
    try:
        j = json.load(open(f"{d}/aa{i}.json"))
    except (OSError, ValueError):
        continue
    err = open(f"{d}/aa{i}.err").read()
    v = re.findall(r"calibration run 1/1: (\w+)", err)
    b = re.findall(r"A/B done after (\d+) blocks \((\d+) s\)", err)
    cells = []
    for r in j["rows"]:
        det = r["details"]
        lo, hi = det["ci"][0]
        mdes[r["context"]].append(r["mde"])
        cells.append(f"{det['ratios'][0]:.4f}x [{lo:.4f}, {hi:.4f}], {r['mde']:.2%}")
    print(
        f"| {i} | {cells[0]} | {cells[1]} | {b[0][0]} blocks, {b[0][1]} s | {v[-1]}, fp {j['verdict_false_positive_rate']} |"
    )
for c, xs in mdes.items():
    print(c, f"median {100 * statistics.median(xs):.2f}% max {100 * max(xs):.2f}%")
