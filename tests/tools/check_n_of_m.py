"""Checks an N:M checkpoint with h5py: in every masked kernel, every group of m consecutive
input channels (per output channel and filter tap) has at most n non-zeros.

usage: python3 check_n_of_m.py CKPT.h5
"""
import sys

import h5py
import numpy as np

bad = checked = 0
with h5py.File(sys.argv[1], "r") as f:
    for name, layer in f["layers"].items():
        if "mask" not in layer or layer["mask"].attrs["kind"] != "n_of_m":
            continue
        n, m = int(layer["mask"].attrs["n"]), int(layer["mask"].attrs["m"])
        w = layer["kernel"][...]
        w = w.reshape(w.shape[0], w.shape[1], -1)                 # [K, C, taps]
        groups = w.transpose(0, 2, 1).reshape(w.shape[0], w.shape[2], -1, m)
        nonzero = np.count_nonzero(groups, axis=-1)
        checked += nonzero.size
        bad += int(np.sum(nonzero > n))
        print(f"{name:30s} {n}:{m}  groups {nonzero.size:7d}  max non-zeros {nonzero.max()}")
print(f"{checked} groups checked, {bad} with more than n non-zeros")
sys.exit(1 if bad or not checked else 0)
