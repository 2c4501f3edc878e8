"""The test images a checkpoint was evaluated on, read as Topiary reads them.

    images, labels = topiary.datasets.test_set(ckpt)   # uint8 [N, H, W, C], int64 [N]
    logits = model(torch.from_numpy(ckpt.input.normalize(images)))

MNIST-format IDX files (raw or .gz: MNIST, Fashion-MNIST; data.path, by default Debian's
/usr/share/datasets/fashion-mnist) and CIFAR-10 binary batches; the first data.test_limit
images, in file order, as the runner evaluates them.
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import Tuple

import numpy as np

DEFAULT_PATHS = {"FASHION_MNIST": "/usr/share/datasets/fashion-mnist",
                 "DATASET_UNSPECIFIED": "/usr/share/datasets/fashion-mnist"}
MAX_FILE_BYTES = 1 << 30


def _read(path: str) -> bytes:
    if os.path.getsize(path) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: over {MAX_FILE_BYTES} bytes")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: over {MAX_FILE_BYTES} bytes uncompressed")
    return data


def read_idx(path: str) -> np.ndarray:
    """An IDX file of unsigned bytes (magic 0x0000080N), sizes checked against its length."""
    data = _read(path)
    if len(data) < 4 or data[:3] != b"\0\0\x08" or not 1 <= data[3] <= 4:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = data[3]
    if len(data) < 4 + 4 * rank:
        raise ValueError(f"{path}: truncated header")
    dims = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
    count = int(np.prod(dims, dtype=np.int64))
    if len(data) != 4 + 4 * rank + count:
        raise ValueError(f"{path}: {len(data)} bytes, the header declares {4 + 4 * rank + count}")
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(dims)


def _find(folder: str, names) -> str:
    for n in names:
        if os.path.isfile(os.path.join(folder, n)):
            return os.path.join(folder, n)
    raise FileNotFoundError(f"{folder}: none of {', '.join(names)}")


def test_set(ckpt) -> Tuple[np.ndarray, np.ndarray]:
    """The images [N, H, W, C] (uint8) and labels [N] the checkpoint's run evaluated on."""
    data = ckpt.spec_message().data
    from topiary.v1 import experiment_pb2
    kind = experiment_pb2.DataSpec.Dataset.Name(data.dataset)
    folder = data.path or DEFAULT_PATHS.get(kind, "")
    if kind in ("FASHION_MNIST", "MNIST", "DATASET_UNSPECIFIED"):
        images = read_idx(_find(folder, ["t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz",
                                         "t10k-images.idx3-ubyte"]))[..., None]
        labels = read_idx(_find(folder, ["t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz",
                                         "t10k-labels.idx1-ubyte"]))
    elif kind == "CIFAR10":
        raw = np.frombuffer(_read(_find(folder, ["test_batch.bin"])), np.uint8).reshape(-1, 3073)
        labels = raw[:, 0]
        images = raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    else:
        raise NotImplementedError(f"data.dataset: {kind} is not read here")
    if len(images) != len(labels):
        raise ValueError(f"{folder}: {len(images)} images but {len(labels)} labels")
    n = data.test_limit if 0 < data.test_limit < len(labels) else len(labels)
    return np.ascontiguousarray(images[:n]), labels[:n].astype(np.int64)
