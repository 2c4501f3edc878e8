"""Loads a Topiary checkpoint with h5py: weights, masks, provenance (docs/checkpoint-format.md).

usage: python3 load_checkpoint.py CKPT.h5
"""
import json
import sys

import h5py
import numpy as np

with h5py.File(sys.argv[1], "r") as f:
    assert f.attrs["format"] == "topiary-checkpoint", "not a Topiary checkpoint"
    print(f"{f.attrs['model_arch']} round {f.attrs['round']} epoch {f.attrs['epoch']}, "
          f"format_version {f.attrs['format_version']}")
    metrics = json.loads(f.attrs["metrics"])
    print(f"test top-1 {metrics.get('test_top1', 0):.4f}")
    for name in f.attrs["layer_order"].split(","):
        layer = f["layers"].get(name)
        if layer is None or "kernel" not in layer:
            continue
        w = layer["kernel"][...]                  # float32, conv OIHW [K, C, R, S]
        if "mask" in layer:
            mask = layer["mask"]
            if mask.attrs["kind"] == "block":     # [C/block_in, K/block_out] grid
                bi, bo = int(mask.attrs["block_in"]), int(mask.attrs["block_out"])
                grid = mask[...].astype(bool)
                keep = np.repeat(np.repeat(grid, bi, 0), bo, 1)[: w.shape[1], : w.shape[0]].T
                keep = keep.reshape(keep.shape + (1,) * (w.ndim - 2))  # broadcast over R, S
            else:                                 # element or n_of_m: the kernel's shape
                keep = mask[...].astype(bool)
            assert not np.any(w[~np.broadcast_to(keep, w.shape)]), "masked weights are zero"
            kind = mask.attrs["kind"]
        else:
            kind = "dense"
        print(f"{name:30s} {str(w.shape):18s} {kind:8s} sparsity {np.mean(w == 0):.3f}")
