#!/usr/bin/env python3
"""The GPU machine's half of the acceptance checks (CI has no GPU, PyTorch CUDA or
onnxruntime). For each checkpoint given: its recorded top-1, Topiary's own evaluation
(`topiary evaluate --json`), the PyTorch twin on CUDA (TF32 off) and on the CPU, and the
ONNX export (folded and kept batch norm) in onnxruntime, each on the same test images, as
correct-image counts. Prints one JSON object per checkpoint; exits 1 when a count differs
from the recorded one.

    python3 gpu_check.py --topiary PATH/topiary CKPT.h5...
"""
import argparse
import json
import subprocess
import sys

import numpy as np
import torch

import topiary
from topiary import datasets

parser = argparse.ArgumentParser()
parser.add_argument("--topiary", required=True)
parser.add_argument("checkpoints", nargs="+")
args = parser.parse_args()

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
try:
    import onnxruntime
except ImportError as e:
    onnxruntime = None
    print(f"onnxruntime is not installed here ({e}): the ONNX counts are left out",
          file=sys.stderr)

ok = True
for path in args.checkpoints:
    ckpt = topiary.load_checkpoint(path)
    images, labels = datasets.test_set(ckpt)
    x = ckpt.input.normalize(images)
    n = len(labels)
    row = {"checkpoint": path, "arch": ckpt.arch, "round": ckpt.round,
           "sparsity": round(ckpt.sparsity(), 4), "images": n,
           "recorded": round(ckpt.test_top1 * n)}
    ev = json.loads(subprocess.run([args.topiary, "evaluate", path, "--json"], check=True,
                                   capture_output=True, text=True).stdout.splitlines()[-1])
    row["topiary_evaluate"] = round(ev["top1"] * ev["images"])
    for device in ("cuda", "cpu"):
        model = topiary.to_torch_model(ckpt, device)
        with torch.no_grad():
            logits = torch.cat([model(torch.from_numpy(x[i:i + 1000]).to(device)).cpu()
                                for i in range(0, n, 1000)])
        row[f"torch_{device}"] = int((logits.argmax(1).numpy() == labels).sum())
    state = topiary.to_torch_state_dict(ckpt)
    row["torch_masked_layers_with_nonzeros"] = sum(
        int(state[k + ".weight"].numpy()[~keep].any()) for k, keep in ckpt.masks().items())
    if onnxruntime is not None:
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                     if p in onnxruntime.get_available_providers()]
        for bn in ("fold", "keep"):
            out = f"{path}.{bn}.onnx"
            subprocess.run([args.topiary, "export", path, "--onnx", out, "--batch", "dynamic",
                            "--batch_norm", bn], check=True, capture_output=True)
            session = onnxruntime.InferenceSession(out, providers=providers)
            raw = images.transpose(0, 3, 1, 2).astype(np.float32)
            logits = np.concatenate([session.run(["logits"], {"input": raw[i:i + 1000]})[0]
                                     for i in range(0, n, 1000)])
            row[f"onnxruntime_{bn}"] = int((logits.argmax(1) == labels).sum())
            row["onnxruntime_provider"] = session.get_providers()[0]
    counts = {k: v for k, v in row.items()
              if k.startswith(("torch_c", "onnxruntime_f", "onnxruntime_k", "topiary_"))}
    row["all_equal"] = all(v == row["recorded"] for v in counts.values())
    ok &= row["all_equal"]
    print(json.dumps(row), flush=True)
sys.exit(0 if ok else 1)
