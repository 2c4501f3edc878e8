"""Topiary checkpoints (HDF5, docs/checkpoint-format.md) as numpy arrays.

    ckpt = topiary.load_checkpoint("round-003.h5")
    ckpt.arch, ckpt.round, ckpt.metrics["test_top1"]
    ckpt.layers["stage1.block0.conv1"].kernel      # float32 OIHW, zero where masked
    ckpt.layers["stage1.block0.conv1"].keep()      # bool, the kernel's shape
    x = ckpt.input.normalize(images)               # raw pixels [N, H, W(, C)] -> NCHW float32

The file is treated as untrusted, as Topiary's own readers do: before anything is read it
must be a regular file of at most `max_bytes`, hold only hard links, float32 or uint8
datasets without external storage or filters other than Fletcher-32, whose sizes fit in the
file, at the places the format defines; then values are checked (finite floats, 0/1 masks of
the right shape) and, by default, the metadata checksum. A failure raises CheckpointError
naming the file and the object.
"""
from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import h5py
import numpy as np

from topiary.checksum import CHECKSUM_ATTR, metadata_crc32c, seal_error

FORMAT = "topiary-checkpoint"
FORMAT_VERSION = 2
MAX_BYTES = 2 << 30
_LAYER_DATASETS = ("kernel", "bias", "gamma", "beta", "running_mean", "running_var", "mask",
                   "activation_range")


class CheckpointError(ValueError):
    """The file is not a readable Topiary checkpoint; the message names the file and object."""


@dataclass
class InputFormat:
    """What the network reads: images height x width x channels of raw values in
    [0, max_value], normalized per channel as (v * (1 / max_value) - mean) * inv_std."""
    layout: str
    height: int
    width: int
    channels: int
    classes: int
    max_value: float
    mean: np.ndarray     # float32 [channels]
    inv_std: np.ndarray  # float32 [channels]

    def normalize(self, images: np.ndarray) -> np.ndarray:
        """Raw images [N, H, W, C] (or [N, H, W] for one channel), e.g. uint8, to the network's
        input as NCHW float32, with the float32 arithmetic of Topiary's batcher, bit for bit."""
        x = np.asarray(images)
        if x.ndim == 3:
            x = x[..., None]
        if x.shape[1:] != (self.height, self.width, self.channels):
            raise ValueError(f"images of shape {x.shape[1:]}, the network reads "
                             f"{(self.height, self.width, self.channels)} (H, W, C)")
        scale = np.float32(1.0) / np.float32(self.max_value)
        y = (x.astype(np.float32) * scale - self.mean) * self.inv_std
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2), dtype=np.float32)


@dataclass
class LayerParams:
    """One layer's datasets (None where the layer has none) and attributes."""
    name: str
    kernel: Optional[np.ndarray] = None          # conv OIHW [K, C, R, S], linear [out, in]
    bias: Optional[np.ndarray] = None
    gamma: Optional[np.ndarray] = None
    beta: Optional[np.ndarray] = None
    running_mean: Optional[np.ndarray] = None
    running_var: Optional[np.ndarray] = None
    activation_range: Optional[np.ndarray] = None
    mask: Optional[np.ndarray] = None            # as stored: block grid, or the kernel's shape
    mask_kind: str = ""                          # block | element | n_of_m | "" (dense)
    mask_attrs: Dict[str, int] = field(default_factory=dict)
    attrs: Dict[str, object] = field(default_factory=dict)  # multiplier, weight_gradient, ...

    def keep(self) -> Optional[np.ndarray]:
        """The mask expanded to the kernel's shape (True = kept), or None when dense."""
        if self.mask is None or self.kernel is None:
            return None
        if self.mask_kind != "block":
            return self.mask.astype(bool)
        bi, bo = self.mask_attrs["block_in"], self.mask_attrs["block_out"]
        k, c = self.kernel.shape[:2]
        grid = self.mask.astype(bool)  # [input blocks, output blocks]
        keep = np.repeat(np.repeat(grid, bi, 0), bo, 1)[:c, :k].T  # [K, C]
        return np.broadcast_to(keep.reshape(keep.shape + (1,) * (self.kernel.ndim - 2)),
                               self.kernel.shape).copy()


@dataclass
class Checkpoint:
    path: str
    arch: str
    experiment_id: str
    parent: str
    created_at: str
    round: int
    epoch: int
    global_step: int
    spec: str                       # the run's ExperimentSpec, text format, defaults filled in
    metrics: dict                   # test_top1, test_loss, sparsity, rounds, ...
    input: Optional[InputFormat]    # None in checkpoints written before it was recorded
    layer_order: List[str]
    layers: Dict[str, LayerParams]  # conv, batch-norm and linear layers, in layer_order
    momentum: Dict[str, np.ndarray] = field(default_factory=dict)  # "layer.role" (momentum=True)
    # The network graph (topiary/v1/network.proto as a dict: arch, height, width, channels,
    # classes, layers); None in files written before checkpoints recorded it.
    network: Optional[dict] = None

    def spec_message(self):
        """The spec as a topiary.v1.experiment_pb2.ExperimentSpec."""
        from google.protobuf import text_format
        from topiary.v1 import experiment_pb2
        return text_format.Parse(self.spec, experiment_pb2.ExperimentSpec(),
                                 allow_unknown_field=True)

    @property
    def width(self) -> float:
        """The model's width multiplier (model.width in the spec; 1 when unset)."""
        width = self.spec_message().model.width
        return width if width > 0 else 1.0

    @property
    def test_top1(self) -> float:
        return float(self.metrics.get("test_top1", 0.0))

    def weights(self) -> Dict[str, np.ndarray]:
        """Every parameter as "layer.role" -> array (role: kernel, bias, gamma, ...)."""
        out = {}
        for layer in self.layers.values():
            for role in _LAYER_DATASETS:
                value = getattr(layer, role)
                if role != "mask" and value is not None:
                    out[f"{layer.name}.{role}"] = value
        return out

    def masks(self) -> Dict[str, np.ndarray]:
        """Each masked layer's keep array, the kernel's shape."""
        return {n: l.keep() for n, l in self.layers.items() if l.mask is not None}

    def sparsity(self) -> float:
        """Zeros over all conv and linear kernels (as the metrics' sparsity)."""
        kernels = [l.kernel for l in self.layers.values() if l.kernel is not None]
        total = sum(k.size for k in kernels)
        return float(sum(int(np.count_nonzero(k == 0)) for k in kernels) / total) if total else 0.0


def _bad(path: str, obj: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: {obj}: {why}")


def _walk(path: str, group: h5py.Group, prefix: str, depth: int, out: Dict[str, h5py.Dataset]):
    """Every dataset below `group`, refusing soft and external links (never followed)."""
    if depth > 8:
        raise _bad(path, prefix or "/", "nested deeper than a checkpoint is")
    for name in group:
        where = f"{prefix}/{name}"
        link = group.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise _bad(path, where, f"a {type(link).__name__}: only hard links are allowed")
        obj = group[name]
        if isinstance(obj, h5py.Group):
            _walk(path, obj, where, depth + 1, out)
        elif isinstance(obj, h5py.Dataset):
            out[where] = obj
        else:
            raise _bad(path, where, "neither a group nor a dataset")


def _check_dataset(path: str, where: str, d: h5py.Dataset) -> int:
    """The dataset's size in bytes, after checking what it may be."""
    parts = where.strip("/").split("/")
    want = np.dtype("u1") if parts[-1] == "mask" and parts[0] == "layers" else np.dtype("<f4")
    if d.dtype != want:
        raise _bad(path, where, f"element type {d.dtype}, not {want.name}")
    if not 1 <= len(d.shape) <= 8:
        raise _bad(path, where, f"rank {len(d.shape)}, not 1 to 8")
    if d.external or d.is_virtual:
        raise _bad(path, where, "external or virtual storage")
    if d.compression or d.shuffle or d.scaleoffset is not None:
        raise _bad(path, where, "a filter other than Fletcher-32")
    if not ((len(parts) == 3 and parts[0] == "layers" and parts[2] in _LAYER_DATASETS) or
            (len(parts) == 4 and parts[:2] == ["optimizer", "momentum"])):
        raise _bad(path, where, "not a place the checkpoint format defines")
    nbytes = int(np.prod(d.shape, dtype=np.int64)) * d.dtype.itemsize
    if d.id.get_storage_size() < nbytes:  # fill values stand in for bytes never written
        raise _bad(path, where, "unwritten or damaged: fewer bytes stored than it holds")
    return nbytes


def _read(path: str, where: str, d: h5py.Dataset) -> np.ndarray:
    try:
        a = d[...]
    except OSError as e:  # a Fletcher-32 mismatch, a damaged chunk
        raise _bad(path, where, f"unreadable ({e})") from None
    if a.dtype == np.float32 and not np.all(np.isfinite(a)):
        raise _bad(path, where, "a value that is not finite")
    if where.endswith("/running_var") and np.any(a < 0):
        raise _bad(path, where, "a negative variance")
    if a.dtype == np.uint8 and np.any(a > 1):
        raise _bad(path, where, "a mask value other than 0 or 1")
    return a


def _int_attr(path: str, attrs, name: str, lo: int, hi: int) -> int:
    if name not in attrs:
        raise _bad(path, f"/@{name}", "missing")
    v = attrs[name]
    if not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
        raise _bad(path, f"/@{name}", f"{v!r} is not an integer in [{lo}, {hi}]")
    return int(v)


def _str_attr(path: str, attrs, name: str, required: bool = True) -> str:
    if name not in attrs:
        if required:
            raise _bad(path, f"/@{name}", "missing")
        return ""
    v = attrs[name]
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str):
        raise _bad(path, f"/@{name}", "not a string")
    return v


def _input_format(path: str, text: str) -> InputFormat:
    try:
        j = json.loads(text)
        fmt = InputFormat(layout=str(j.get("layout", "NHWC")), height=int(j["height"]),
                          width=int(j["width"]), channels=int(j["channels"]),
                          classes=int(j["classes"]), max_value=float(j["max_value"]),
                          mean=np.asarray(j["mean"], dtype=np.float32),
                          inv_std=np.asarray(j["inv_std"], dtype=np.float32))
    except (ValueError, KeyError, TypeError) as e:
        raise _bad(path, "/@input", f"not an input format ({e})") from None
    if not (0 < fmt.height <= 4096 and 0 < fmt.width <= 4096 and 0 < fmt.channels <= 64 and
            0 < fmt.classes and fmt.max_value > 0 and fmt.mean.shape == (fmt.channels,) and
            fmt.inv_std.shape == (fmt.channels,) and np.all(np.isfinite(fmt.mean)) and
            np.all(np.isfinite(fmt.inv_std))):
        raise _bad(path, "/@input", "implausible sizes or values")
    return fmt


def load_checkpoint(path: str, *, momentum: bool = False, verify_checksum: bool = True,
                    max_bytes: int = MAX_BYTES) -> Checkpoint:
    """Reads a checkpoint: weights, masks, batch-norm statistics, provenance and metrics (and
    the momentum buffers with momentum=True). Raises CheckpointError for anything that is not
    a valid Topiary checkpoint, before reading what the file declares."""
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: not a regular file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise CheckpointError(f"{path}: {size} bytes, over the {max_bytes}-byte limit")
    # Read whole and the seal checked before libhdf5 parses a byte (it crashes on some damaged
    # metadata); h5py then parses exactly those bytes, from memory.
    with open(path, "rb") as raw:
        data = raw.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CheckpointError(f"{path}: over the {max_bytes}-byte limit")
    if verify_checksum:
        problem = seal_error(data)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem[0]}")
    try:
        f = h5py.File(io.BytesIO(data), "r")
    except OSError as e:
        raise CheckpointError(f"{path}: not an HDF5 file ({e})") from None
    with f:
        a = f.attrs
        if _str_attr(path, a, "format") != FORMAT:
            raise _bad(path, "/@format", "not a Topiary checkpoint")
        version = _int_attr(path, a, "format_version", 0, 1 << 31)
        if version != FORMAT_VERSION:
            raise _bad(path, "/@format_version", f"{version}; this reader reads {FORMAT_VERSION}")
        datasets: Dict[str, h5py.Dataset] = {}
        _walk(path, f, "", 0, datasets)
        total = sum(_check_dataset(path, w, d) for w, d in datasets.items())
        if total > size:
            raise _bad(path, "/", f"datasets declare {total} bytes, more than the file's {size}")
        if verify_checksum:
            stored = _int_attr(path, a, CHECKSUM_ATTR, 0, (1 << 32) - 1)
            if stored != metadata_crc32c(f):
                raise _bad(path, f"/@{CHECKSUM_ATTR}", "checksum mismatch: an attribute, shape "
                           "or name was changed or damaged")
        rng = f.get("rng")
        if not isinstance(rng, h5py.Group) or "seed" not in rng.attrs or \
                "next_epoch" not in rng.attrs:
            raise _bad(path, "/rng", "missing, or without seed and next_epoch")
        layer_order = [n for n in _str_attr(path, a, "layer_order").split(",") if n]
        try:
            metrics = json.loads(_str_attr(path, a, "metrics") or "{}")
        except ValueError:
            raise _bad(path, "/@metrics", "not JSON") from None
        input_text = _str_attr(path, a, "input", required=False)
        network_text = _str_attr(path, a, "network", required=False)
        try:
            network = json.loads(network_text) if network_text else None
        except ValueError:
            raise _bad(path, "/@network", "not JSON") from None
        ckpt = Checkpoint(
            path=path, arch=_str_attr(path, a, "model_arch"),
            experiment_id=_str_attr(path, a, "experiment_id"),
            parent=_str_attr(path, a, "parent", required=False),
            created_at=_str_attr(path, a, "created_at"),
            round=_int_attr(path, a, "round", 0, (1 << 31) - 1),
            epoch=_int_attr(path, a, "epoch", 0, (1 << 31) - 1),
            global_step=_int_attr(path, a, "global_step", 0, 1 << 62),
            spec=_str_attr(path, a, "spec"), metrics=metrics,
            input=_input_format(path, input_text) if input_text else None,
            layer_order=layer_order, layers={}, network=network)
        order = {n: i for i, n in enumerate(layer_order)}
        for where in sorted(datasets, key=lambda w: (order.get(w.split("/")[2], 1 << 30), w)):
            parts = where.strip("/").split("/")
            if parts[0] == "optimizer":
                if momentum:
                    ckpt.momentum[f"{parts[2]}.{parts[3]}"] = _read(path, where, datasets[where])
                continue
            name, role = parts[1], parts[2]
            layer = ckpt.layers.setdefault(name, LayerParams(name=name))
            if not layer.attrs:
                layer.attrs = {k: _plain(v) for k, v in f["layers"][name].attrs.items()}
            setattr(layer, role, _read(path, where, datasets[where]))
            if role == "mask":
                m = datasets[where].attrs
                layer.mask_kind = _plain(m.get("kind", ""))
                # A block grid's axes (absent in older files): [input blocks, output blocks].
                axes = _plain(m.get("axes", BLOCK_MASK_AXES))
                if axes != BLOCK_MASK_AXES:
                    raise _bad(path, where + "@axes", f"{axes!r}; block grids are [{BLOCK_MASK_AXES}]")
                try:
                    layer.mask_attrs = {k: int(v) for k, v in m.items() if k not in ("kind", "axes")}
                except (TypeError, ValueError):
                    raise _bad(path, where, "mask attributes must be integers") from None
        for layer in ckpt.layers.values():
            _check_mask(path, layer)
        return ckpt


BLOCK_MASK_AXES = "input_blocks,output_blocks"


def _plain(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.generic):
        return v.item()
    return v


def _check_mask(path: str, layer: LayerParams):
    if layer.mask is None:
        return
    where = f"/layers/{layer.name}/mask"
    if layer.kernel is None:
        raise _bad(path, where, "a mask without a kernel")
    if layer.mask_kind == "block":
        bi, bo = layer.mask_attrs.get("block_in", 0), layer.mask_attrs.get("block_out", 0)
        if not (1 <= bi <= 1024 and 1 <= bo <= 1024):
            raise _bad(path, where, "block sizes outside 1..1024")
        k, c = layer.kernel.shape[:2]
        want = (math.ceil(c / bi), math.ceil(k / bo))
    elif layer.mask_kind in ("element", "n_of_m"):
        want = layer.kernel.shape
    else:
        raise _bad(path, where, f"mask kind {layer.mask_kind!r}")
    if layer.mask.shape != want:
        raise _bad(path, where, f"shape {layer.mask.shape}, expected {want}")
