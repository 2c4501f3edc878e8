"""Checkpoints in Python: load_checkpoint's arrays against Topiary's own report, hostile files
refused by name, the PyTorch twins evaluating to Topiary's recorded top-1 on the same images,
and ONNX export (checker, exact zeros, the same top-1)."""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import onnxruntime
import pytest

import topiary
from topiary import datasets
from topiary.checksum import CHECKSUM_ATTR, metadata_crc32c, seal

import onnx_numpy


def inspect_json(cli, path):
    out = subprocess.run([cli, "inspect", "--file", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def test_arrays_match_topiarys_report(topiary_cli, pruned_checkpoint):
    ckpt = topiary.load_checkpoint(pruned_checkpoint, momentum=True)
    report = inspect_json(topiary_cli, pruned_checkpoint)
    assert ckpt.arch == report["model_arch"] == "resnet20" and ckpt.round == report["round"]
    assert ckpt.width == 0.5 and ckpt.input.height == 28 and ckpt.input.classes == 10
    assert ckpt.sparsity() == pytest.approx(report["sparsity"], abs=1e-9)
    assert ckpt.metrics["sparsity"] == pytest.approx(report["sparsity"], abs=1e-6)
    assert ckpt.layer_order[0] == "stem.conv" and list(ckpt.layers)[0] == "stem.conv"
    masked = 0
    for row in report["layers"]:
        layer = ckpt.layers[row["layer"]]
        assert list(layer.kernel.shape) == [int(s) for s in row["shape"]]
        assert int(np.count_nonzero(layer.kernel == 0)) == int(row["zeros"])
        keep = layer.keep()
        if row.get("mask", "MASK_NONE") != "MASK_NONE":
            masked += 1
            assert layer.mask_kind == "block" and row["mask"] == "MASK_BLOCK"
            assert keep.shape == layer.kernel.shape and not np.any(layer.kernel[~keep])
            assert int(layer.mask.sum()) == int(row["blocks_kept"])
    assert masked > 0
    bn = ckpt.layers["stage1.block0.bn1"]
    assert bn.gamma.shape == bn.running_var.shape == (8,) and np.all(bn.running_var >= 0)
    assert set(ckpt.weights()) >= {"stem.conv.kernel", "fc.bias", "stem.bn.running_mean"}
    assert ckpt.momentum["stem.conv.kernel"].shape == ckpt.layers["stem.conv"].kernel.shape


def _copy(src, dst, edit):
    """A copy of src changed by edit(h5py.File), its checksum and seal made right again, so
    that the reader must find the damage itself."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)
        f.attrs[CHECKSUM_ATTR] = np.int64(metadata_crc32c(f))
    seal(str(dst))
    return str(dst)


def _replace(f, path, data):
    attrs = dict(f[path].attrs)
    del f[path]
    d = f.create_dataset(path, data=data)
    for k, v in attrs.items():
        d.attrs[k] = v


HOSTILE = {
    "soft link": (lambda f: f["layers"].__setitem__("evil", h5py.SoftLink("/layers/fc")),
                  "SoftLink"),
    "external link": (lambda f: f["layers"].__setitem__(
        "evil", h5py.ExternalLink("/etc/passwd", "/")), "ExternalLink"),
    "float64 kernel": (lambda f: _replace(f, "layers/fc/kernel",
                                          f["layers/fc/kernel"][...].astype(np.float64)),
                       "/layers/fc/kernel: element type float64"),
    "not finite": (lambda f: _replace(f, "layers/fc/bias",
                                      np.full(f["layers/fc/bias"].shape, np.nan, np.float32)),
                   "/layers/fc/bias: a value that is not finite"),
    "mask value 2": (lambda f: _replace(f, "layers/stage1.block0.conv1/mask",
                                        f["layers/stage1.block0.conv1/mask"][...] * 2),
                     "mask value other than 0 or 1"),
    "mask grid wrong": (lambda f: _replace(f, "layers/stage1.block0.conv1/mask",
                                           np.ones((1, 1), np.uint8)), "shape (1, 1), expected"),
    "block axes swapped": (lambda f: f["layers/stage1.block0.conv1/mask"].attrs.__setitem__(
        "axes", "output_blocks,input_blocks"), "/layers/stage1.block0.conv1/mask@axes"),
    "stray dataset": (lambda f: f.create_dataset("payload", data=np.zeros(4, np.float32)),
                      "/payload: not a place the checkpoint format defines"),
    "compressed": (lambda f: (f.__delitem__("layers/fc/bias"),
                              f.create_dataset("layers/fc/bias", data=np.zeros(10, np.float32),
                                               compression="gzip")),
                   "a filter other than Fletcher-32"),
    "format version": (lambda f: f.attrs.__setitem__("format_version", np.int64(9)),
                       "/@format_version: 9"),
    "foreign": (lambda f: f.attrs.__setitem__("format", "something-else"),
                "/@format: not a Topiary checkpoint"),
    "bad input format": (lambda f: f.attrs.__setitem__("input", '{"height": -1}'), "/@input"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_are_refused_by_name(pruned_checkpoint, tmp_path, case):
    edit, expected = HOSTILE[case]
    path = _copy(pruned_checkpoint, tmp_path / "hostile.h5", edit)
    with pytest.raises(topiary.CheckpointError) as e:
        topiary.load_checkpoint(path)
    assert expected in str(e.value) and path in str(e.value)


def test_topiarys_hostile_corpus(tmp_path):
    """Every hostile file tests/tools:make_hostile_files writes for Topiary's C++ readers."""
    tool = os.environ["MAKE_HOSTILE"]
    folder = tmp_path / "hostile"
    folder.mkdir()
    out = subprocess.run([tool, str(folder), str(tmp_path / "outside.h5")], check=True,
                         capture_output=True, text=True).stdout
    cases = [line.split("\t")[0] for line in out.splitlines() if line.strip()]
    assert len(cases) >= 17
    assert topiary.load_checkpoint(str(folder / "good.h5"), momentum=True).arch
    for name in cases:
        with pytest.raises(topiary.CheckpointError) as e:
            topiary.load_checkpoint(str(folder / name), momentum=True)
        assert name in str(e.value)


def test_damaged_files(pruned_checkpoint, tmp_path):
    changed = tmp_path / "changed.h5"
    shutil.copy(pruned_checkpoint, changed)
    with h5py.File(changed, "r+") as f:  # an attribute changed without the checksums
        f.attrs["round"] = np.int64(99)
    with pytest.raises(topiary.CheckpointError, match="whole-file checksum mismatch"):
        topiary.load_checkpoint(str(changed))
    seal(str(changed))  # sealed again: the metadata checksum still finds the change
    with pytest.raises(topiary.CheckpointError, match="metadata_crc32c: checksum mismatch"):
        topiary.load_checkpoint(str(changed))
    assert topiary.load_checkpoint(str(changed), verify_checksum=False).round == 99
    with h5py.File(tmp_path / "foreign.h5", "w") as f:  # HDF5 from another tool: no seal
        f["x"] = np.zeros(3, np.float32)
    with pytest.raises(topiary.CheckpointError, match="without Topiary's seal"):
        topiary.load_checkpoint(str(tmp_path / "foreign.h5"))
    with pytest.raises(topiary.CheckpointError, match="missing.h5: no such file"):
        topiary.load_checkpoint(str(tmp_path / "missing.h5"))
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(open(pruned_checkpoint, "rb").read()[:5000])
    with pytest.raises(topiary.CheckpointError, match="truncated.h5"):
        topiary.load_checkpoint(str(truncated))
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    with pytest.raises(topiary.CheckpointError, match="not an HDF5 file"):
        topiary.load_checkpoint(str(text))
    with pytest.raises(topiary.CheckpointError, match="not a regular file"):
        topiary.load_checkpoint(str(tmp_path))
    with pytest.raises(topiary.CheckpointError, match="over the 1000-byte limit"):
        topiary.load_checkpoint(pruned_checkpoint, max_bytes=1000)


def test_normalize_is_topiarys_arithmetic(lenet_checkpoint):
    ckpt = topiary.load_checkpoint(lenet_checkpoint)
    images, labels = datasets.test_set(ckpt)
    assert images.shape == (1000, 28, 28, 1) and labels.shape == (1000,)
    x = ckpt.input.normalize(images)
    assert x.shape == (1000, 1, 28, 28) and x.dtype == np.float32
    v = np.arange(256, dtype=np.float32)
    lut = (v * (np.float32(1) / np.float32(255)) - ckpt.input.mean[0]) * ckpt.input.inv_std[0]
    assert np.array_equal(x[:, 0], lut[images[..., 0]])


torch = pytest.importorskip("torch", reason="PyTorch is not installed: the to_torch checks "
                                           "need it (Debian: python3-torch)")


def _torch_correct(ckpt):
    model = topiary.to_torch_model(ckpt)
    images, labels = datasets.test_set(ckpt)
    with torch.no_grad():
        logits = model(torch.from_numpy(ckpt.input.normalize(images))).double().numpy()
    return logits, int(np.sum(logits.argmax(1) == labels)), len(labels)


@pytest.mark.parametrize("which", ["lenet_checkpoint", "pruned_checkpoint"])
def test_pytorch_twin_gives_the_recorded_top1(request, which):
    ckpt = topiary.load_checkpoint(request.getfixturevalue(which))
    _, correct, n = _torch_correct(ckpt)
    assert correct == round(ckpt.test_top1 * n), (correct, ckpt.test_top1 * n)
    sd = topiary.to_torch_state_dict(ckpt)
    for name, keep in ckpt.masks().items():
        assert not sd[name + ".weight"].numpy()[~keep].any()  # masked weights exact zeros


def test_state_dict_checks_the_module(pruned_checkpoint, lenet_checkpoint):
    from topiary.torch_models import build_model
    ckpt = topiary.load_checkpoint(pruned_checkpoint)
    with pytest.raises(ValueError, match="does not fit the module"):
        topiary.to_torch_state_dict(ckpt, build_model("resnet32", 1, 10, 0.5))
    with pytest.raises(ValueError, match="shape"):
        topiary.to_torch_state_dict(ckpt, build_model("resnet20", 1, 10, 1.0))
    with pytest.raises(ValueError, match="not a lenet5"):
        topiary.to_torch_state_dict(ckpt, "lenet5")
    # lenet5: fc1's HWC columns reordered for PyTorch's NCHW flatten.
    lenet = topiary.load_checkpoint(lenet_checkpoint)
    sd = topiary.to_torch_state_dict(lenet)
    w = lenet.layers["fc1"].kernel  # [120, 5*5*16] in (h, w, c) order
    assert sd["fc1.weight"][7, 3 * 25 + 2 * 5 + 4].item() == w[7, (2 * 5 + 4) * 16 + 3]


onnx = pytest.importorskip("onnx", reason="onnx is not installed (Debian: python3-onnx)")


@pytest.mark.parametrize("batch_norm", ["fold", "keep"])
@pytest.mark.parametrize("which", ["lenet_checkpoint", "pruned_checkpoint"])
def test_onnx_export(request, topiary_cli, tmp_path, which, batch_norm):
    path = request.getfixturevalue(which)
    out = tmp_path / "model.onnx"
    summary = json.loads(subprocess.run(
        [topiary_cli, "export", path, "--onnx", str(out), "--batch", "dynamic",
         "--batch_norm", batch_norm, "--json"], check=True, capture_output=True,
        text=True).stdout)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == summary["opset"] == 13
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    ckpt = topiary.load_checkpoint(path)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, keep in ckpt.masks().items():
        assert not inits[name + ".weight"][~keep].any()  # block masks survive as exact zeros
    assert summary["masked"] == sum(int((~k).sum()) for k in ckpt.masks().values())
    ops = {n.op_type for n in model.graph.node}
    if ckpt.arch == "resnet20":
        assert ("BatchNormalization" in ops) == (batch_norm == "keep")
        assert summary["folded"] == (21 if batch_norm == "fold" else 0)
    images, labels = datasets.test_set(ckpt)
    raw = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
    logits = onnx_numpy.run(model, raw)
    recorded = round(ckpt.test_top1 * len(labels))
    assert int(np.sum(logits.argmax(1) == labels)) == recorded, ckpt.test_top1
    # The same file in a real runtime: onnxruntime (the package index's wheel, CPU).
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ort_logits = session.run(None, {session.get_inputs()[0].name: raw})[0]
    assert int(np.sum(ort_logits.argmax(1) == labels)) == recorded
    assert np.allclose(ort_logits, logits, rtol=1e-4, atol=1e-4)


def test_export_errors(topiary_cli, tmp_path, pruned_checkpoint):
    def run(*args):
        return subprocess.run([topiary_cli, "export", *args], capture_output=True, text=True)
    r = run(pruned_checkpoint, "--onnx", str(tmp_path / "x.onnx"), "--batch", "zero")
    assert r.returncode == 3 and "--batch" in r.stderr
    r = run(pruned_checkpoint, "--onnx", str(tmp_path / "x.onnx"), "--batch_norm", "melt")
    assert r.returncode == 3 and "--batch_norm" in r.stderr
    r = run(str(tmp_path / "missing.h5"), "--onnx", str(tmp_path / "x.onnx"))
    assert r.returncode != 0 and "missing.h5" in r.stderr
    r = run(pruned_checkpoint)
    assert r.returncode == 2 and "--onnx" in r.stderr
    assert not (tmp_path / "x.onnx").exists()


def test_export_of_approximate_layers_says_so(topiary_cli, examples, tmp_path):
    spec = open(os.path.join(examples, "tiny.textproto")).read().replace(
        "epochs: 2", "epochs: 1") + (
        '\napproximation { rules { layer: "conv2" multiplier: "trunc:4" } '
        'weight_code: SIGN_MAGNITUDE per_channel_weights: true }\n')
    (tmp_path / "approx.textproto").write_text(spec)
    subprocess.run([topiary_cli, "run", str(tmp_path / "approx.textproto"), "--out",
                    str(tmp_path / "run")], check=True, capture_output=True)
    r = subprocess.run([topiary_cli, "export", str(tmp_path / "run/checkpoints/dense.h5"),
                        "--onnx", str(tmp_path / "a.onnx")], capture_output=True, text=True)
    assert r.returncode == 0 and "exported as exact convolutions" in r.stderr and "conv2" in r.stderr
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "a.onnx")).metadata_props}
    assert meta["topiary.approximate_layers_exported_exact"] == "conv2"
    # How the exact graph was approximated in training, for hardware flows.
    with h5py.File(tmp_path / "run/checkpoints/dense.h5", "r") as f:
        sha = f["layers/conv2"].attrs["multiplier_sha256"]
        sha = sha.decode() if isinstance(sha, bytes) else str(sha)
    assert len(sha) == 64
    assert json.loads(meta["topiary.approximation"]) == {"conv2": {
        "multiplier": "trunc:4", "multiplier_sha256": sha, "weight_code": "sign_magnitude",
        "weight_scales": "per_channel", "activation_range": "per_batch", "weight_tuning": False}}
    assert json.loads(meta["topiary.input"])["max_value"] == 255


@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "resnet32"])
def test_other_zoo_models(topiary_cli, tmp_path, arch):
    """ImageNet-style stems and bottlenecks (and a deeper CIFAR ResNet), briefly trained at a
    quarter width: the PyTorch twin and the ONNX export both give the recorded top-1, and
    their logits agree."""
    spec = (f'name: "{arch}" seed: 5 model {{ arch: "{arch}" width: 0.25 }}\n'
            'data { dataset: FASHION_MNIST batch_size: 64 train_limit: 512 test_limit: 200 }\n'
            'train { epochs: 1 optimizer { lr: 0.05 momentum: 0.9 } }\ndevice { kind: CPU }\n')
    (tmp_path / "spec.textproto").write_text(spec)
    subprocess.run([topiary_cli, "run", str(tmp_path / "spec.textproto"), "--out",
                    str(tmp_path / "run")], check=True, capture_output=True)
    path = str(tmp_path / "run/checkpoints/dense.h5")
    ckpt = topiary.load_checkpoint(path)
    logits, correct, n = _torch_correct(ckpt)
    assert correct == round(ckpt.test_top1 * n)
    subprocess.run([topiary_cli, "export", path, "--onnx", str(tmp_path / "m.onnx"), "--batch",
                    str(n)], check=True, capture_output=True)
    model = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(model, full_check=True)
    images, labels = datasets.test_set(ckpt)
    onnx_logits = onnx_numpy.run(model, images.transpose(0, 3, 1, 2).astype(np.float32))
    assert int(np.sum(onnx_logits.argmax(1) == labels)) == correct
    assert np.allclose(onnx_logits, logits, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def channel_checkpoint(tmp_path_factory, topiary_cli, examples):
    """The last round of examples/tiny_channel_prune: a compacted (narrower) resnet20."""
    folder = tmp_path_factory.mktemp("channels")
    subprocess.run([topiary_cli, "run", os.path.join(examples, "tiny_channel_prune.textproto"),
                    "--out", str(folder)], check=True, stdout=subprocess.DEVNULL)
    rounds = sorted(f for f in os.listdir(folder / "checkpoints") if f.startswith("round-"))
    return str(folder / "checkpoints" / rounds[-1])


def test_channel_pruned_models_rebuild_small(topiary_cli, tmp_path, channel_checkpoint):
    """A compacted checkpoint: its PyTorch twin is as narrow as the file (and gives the
    recorded top-1), its ONNX export is too, and the two agree on every logit."""
    ckpt = topiary.load_checkpoint(channel_checkpoint)
    narrowed = [l for l in ckpt.network["layers"] if l.get("original_out_channels", 0)]
    assert len(narrowed) > 10
    model = topiary.to_torch_model(ckpt)
    for layer in narrowed:
        module = model.get_submodule(layer["name"])
        assert module.out_channels == layer["out_channels"] < layer["original_out_channels"]
    logits, correct, n = _torch_correct(ckpt)
    assert correct == round(ckpt.test_top1 * n)
    dense = topiary.to_torch_model(topiary.load_checkpoint(
        os.path.join(os.path.dirname(channel_checkpoint), "dense.h5")))
    assert sum(p.numel() for p in model.parameters()) < 0.5 * sum(
        p.numel() for p in dense.parameters())
    out = tmp_path / "small.onnx"
    subprocess.run([topiary_cli, "export", channel_checkpoint, "--onnx", str(out), "--batch",
                    str(n)], check=True, capture_output=True)
    onnx_model = onnx.load(str(out))
    onnx.checker.check_model(onnx_model, full_check=True)
    images, labels = datasets.test_set(ckpt)
    raw = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ort_logits = session.run(None, {session.get_inputs()[0].name: raw})[0]
    assert int(np.sum(ort_logits.argmax(1) == labels)) == correct
    assert np.allclose(ort_logits, logits, rtol=1e-4, atol=1e-4)
