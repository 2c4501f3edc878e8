#!/usr/bin/env python3
"""Bring your own model: train a CNN in PyTorch, import it into Topiary, prune it in rounds,
export it back to ONNX, with the test accuracy at every step.

    python3 examples/torch_import_prune.py [--epochs 3] [--train-limit 20000]
        [--test-limit 10000] [--target 0.5] [--device CPU|CUDA] [--work DIR] [--json]

Needs the Python package (pip install ./clients/python), PyTorch (Debian: python3-torch),
onnxruntime (for the last step), the topiary CLI ($TOPIARY or on PATH) and Fashion-MNIST
(Debian: dataset-fashion-mnist, or --data FOLDER of the four IDX .gz files).
"""
import argparse
import gzip
import json
import os
import subprocess

import numpy as np
import torch
import torch.nn as nn

import topiary

# %% Arguments.
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--epochs", type=int, default=3, help="PyTorch training epochs")
parser.add_argument("--train-limit", type=int, default=20000)
parser.add_argument("--test-limit", type=int, default=10000)
parser.add_argument("--target", type=float, default=0.5, help="the pruning target (sparsity)")
parser.add_argument("--device", default="CPU", help="Topiary's device: CPU or CUDA")
parser.add_argument("--work", default="torch_import_prune")
parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
args = parser.parse_args()
os.makedirs(args.work, exist_ok=True)
TOPIARY = os.environ.get("TOPIARY", "topiary")


# %% Fashion-MNIST from the IDX files, normalized with Topiary's batcher arithmetic (float32:
# (v * (1/255) - mean) * (1/std)), so PyTorch and Topiary see the same numbers.
def idx(name, offset):
    with gzip.open(os.path.join(args.data, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


x_train = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:args.train_limit]
y_train = idx("train-labels-idx1-ubyte.gz", 8)[:args.train_limit]
x_test = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:args.test_limit]
y_test = idx("t10k-labels-idx1-ubyte.gz", 8)[:args.test_limit]
MEAN, STD = np.float32(0.2860), np.float32(0.3530)


def normalize(x):
    return torch.from_numpy((x.astype(np.float32) * np.float32(1 / 255.0) - MEAN) *
                            np.float32(1 / STD))


# %% A MobileNet-flavoured CNN: batch norm, ReLU6, a depthwise convolution.
torch.manual_seed(0)
net = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
    nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32, bias=False), nn.BatchNorm2d(32),
    nn.ReLU6(),
    nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
    nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
xt, yt = normalize(x_train), torch.from_numpy(y_train.astype(np.int64))
for epoch in range(args.epochs):
    net.train()
    order = torch.randperm(len(xt))
    for i in range(0, len(xt), 128):
        batch = order[i:i + 128]
        opt.zero_grad()
        nn.functional.cross_entropy(net(xt[batch]), yt[batch]).backward()
        opt.step()
net.eval()
with torch.no_grad():
    torch_top1 = float((net(normalize(x_test)).argmax(1).numpy() == y_test).mean())
results = {"pytorch_top1": torch_top1}
print(f"1. PyTorch, {args.epochs} epochs on {len(xt)} images: test top-1 {torch_top1:.2%}")

# %% Import: the network (its graph), weights and normalization become a checkpoint.
imported = os.path.join(args.work, "imported.h5")
if os.path.exists(imported):
    os.remove(imported)
summary = topiary.from_torch(net, normalize(x_test[:1]), imported, mean=[MEAN], std=[STD],
                             topiary_bin=TOPIARY if os.path.exists(TOPIARY) else None)
print(f"2. imported: {summary['layers']} layers, {summary['parameters']} parameters "
      f"-> {imported}")


# %% Prune in rounds with Topiary: a spec without model.arch starts from the imported network.
def topiary_run(name, body):
    spec = os.path.join(args.work, name + ".textproto")
    with open(spec, "w") as f:
        f.write(f'name: "{name}"\nseed: 1\ninit_from_checkpoint: "{os.path.abspath(imported)}"\n'
                f'data {{ dataset: FASHION_MNIST path: "{os.path.abspath(args.data)}" '
                f'batch_size: 128 train_limit: {args.train_limit} '
                f'test_limit: {args.test_limit} }}\n'
                f'device {{ kind: {args.device} }}\n{body}')
    out = os.path.join(args.work, name)
    r = subprocess.run([TOPIARY, "run", spec, "--json", "--out", out], capture_output=True,
                       text=True, check=True)
    return json.loads([line for line in r.stdout.splitlines() if '"summary"' in line][-1]), out


evaluated, _ = topiary_run("evaluate", "train { epochs: 0 }\n")
results["topiary_top1"] = evaluated["test_top1"]
print(f"3. Topiary evaluates the imported model: test top-1 {evaluated['test_top1']:.2%}")
pruned, out = topiary_run(
    "prune", "train { optimizer { lr: 0.01 } }\n"
    f"pruning {{ method: BLOCK block_in: 4 block_out: 4 target: {args.target} "
    "step_fraction: 0.5 finetune_epochs: 1 }\n")
rounds = [{"round": r.get("round", 0), "sparsity": r.get("sparsity", 0),
           "test_top1": r.get("test_top1", 0)} for r in pruned["rounds"]]
results["rounds"] = rounds
for r in rounds:
    print(f"4. round {r['round']}: sparsity {r['sparsity']:.1%}, test top-1 {r['test_top1']:.2%}")

# %% Export back: the pruned network as ONNX (pruned weights are exact zeros), in onnxruntime.
last = sorted(f for f in os.listdir(os.path.join(out, "checkpoints")) if f.startswith("round"))[-1]
onnx_path = os.path.join(args.work, "pruned.onnx")
subprocess.run([TOPIARY, "export", os.path.join(out, "checkpoints", last), "--onnx", onnx_path,
                "--batch", "dynamic"], check=True, capture_output=True)
import onnxruntime  # noqa: E402

session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
logits = session.run(None, {"input": x_test.astype(np.float32)})[0]  # raw pixels in
results["onnx_top1"] = float((logits.argmax(1) == y_test).mean())
print(f"5. exported {onnx_path}: onnxruntime test top-1 {results['onnx_top1']:.2%}")
if args.json:
    print(json.dumps(results))
