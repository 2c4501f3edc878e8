#!/usr/bin/env python3
"""Reads benchmark JSON lines (stdin) and prints a markdown table of median images/s per
(model, batch, engine) with the ratio of Topiary to each PyTorch variant."""
import collections, json, statistics, sys

runs = collections.defaultdict(list)
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[(r["model"], r["batch"], r["engine"])].append(r["images_per_s"])

print("| model | batch | engine | images/s (median) | Topiary / this |")
print("|---|---|---|---|---|")
for (model, batch) in sorted({(m, b) for m, b, _ in runs}):
    ours = statistics.median(runs[(model, batch, "topiary")])
    for (m, b, engine), values in sorted(runs.items()):
        if (m, b) != (model, batch):
            continue
        med = statistics.median(values)
        ratio = "" if engine == "topiary" else f"{ours / med:.2f}x"
        print(f"| {model} | {batch} | {engine} | {med:.0f} | {ratio} |")
