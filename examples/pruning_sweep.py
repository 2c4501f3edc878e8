#!/usr/bin/env python3
"""A pruning sweep, notebook style: one experiment per sparsity target, submitted to topiaryd
together, followed until they end, then accuracy against sparsity plotted to a PNG.

    python3 examples/pruning_sweep.py [--spec examples/fashion_resnet20_block50.textproto]
        [--targets 0.3,0.5,0.7,0.9] [--out sweep.png] [--server HOST:PORT]

Needs the Python package (pip install ./clients/python) and matplotlib (Debian:
python3-matplotlib); the daemon from $TOPIARY_SERVER (or --server), with $TOPIARY_TOKEN_FILE
if it wants a token. Every round of every experiment is a point: the curves show what each
prune-then-fine-tune round cost, and where each run ended.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

import topiary  # noqa: E402
from topiary.v1 import experiment_pb2  # noqa: E402

# %% Arguments: the base spec (its pruning block is kept; only the target changes) and targets.
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--spec", default="examples/fashion_resnet20_block50.textproto")
parser.add_argument("--targets", default="0.3,0.5,0.7,0.9")
parser.add_argument("--out", default="sweep.png")
parser.add_argument("--server", default=None, help="default $TOPIARY_SERVER or 127.0.0.1:7077")
parser.add_argument("--json", action="store_true", help="print the results as JSON lines")
args = parser.parse_args()
targets = [float(t) for t in args.targets.split(",")]
base = topiary.parse_spec(open(args.spec).read())
if not base.HasField("pruning"):
    sys.exit(f"{args.spec}: no pruning block to sweep")

# %% Submit one experiment per target.
client = topiary.Client(args.server)
experiments = {}
for target in targets:
    spec = type(base)()
    spec.CopyFrom(base)
    spec.pruning.target = target
    spec.name = f"{base.name or 'sweep'}-t{round(target * 100):02d}"
    experiments[target] = client.submit(spec)
    print(f"submitted {experiments[target].id} ({spec.name}, target {target:.0%})",
          file=sys.stderr)

# %% Follow them: each round's sparsity and accuracy as it finishes.
results = {}
for target, exp in experiments.items():
    rounds = []
    for event in client.watch(exp.id):
        if event.WhichOneof("kind") == "round":
            r = event.round
            rounds.append((r.sparsity, r.test_top1))
            print(f"{exp.id} round {r.round}: sparsity {r.sparsity:.3f}, top-1 {r.test_top1:.4f}",
                  file=sys.stderr)
    final = client.get(exp.id)
    if final.state != topiary.SUCCEEDED:
        sys.exit(f"{exp.id} ended {topiary.state_name(final.state)}: "
                 f"{final.error}")
    results[target] = {"id": exp.id, "sparsity": final.sparsity, "test_top1": final.test_top1,
                       "rounds": rounds}

# %% The table, and the plot: one curve per run through its rounds, the end points joined.
for target, r in results.items():
    if args.json:
        print(json.dumps({"target": target, **r}))
    else:
        print(f"target {target:.0%}: {r['id']} sparsity {r['sparsity']:.3f} "
              f"top-1 {r['test_top1']:.4f} ({len(r['rounds'])} rounds)")
fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
for target, r in results.items():
    xs, ys = zip(*r["rounds"]) if r["rounds"] else ([], [])
    ax.plot(xs, [100 * y for y in ys], marker=".", alpha=0.5, label=f"target {target:.0%}")
ends = sorted((r["sparsity"], r["test_top1"]) for r in results.values())
ax.plot([e[0] for e in ends], [100 * e[1] for e in ends], "k-o", label="final")
ax.set_xlabel("sparsity (conv and linear weights)")
ax.set_ylabel("test top-1 (%)")
method = experiment_pb2.PruningSpec.Method.Name(base.pruning.method)
ax.set_title(f"{base.model.arch}, {method} pruning")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(args.out)
print(f"wrote {args.out}", file=sys.stderr)
