"""topiary.from_torch: a PyTorch CNN (depthwise convolution, ReLU6, concat, batch norm) into a
checkpoint, read back with load_checkpoint, and exported again with `topiary export --onnx`:
onnxruntime's logits on the export equal PyTorch's on the module (so the import and the export
both kept the network). Unsupported operators are an InvalidArgument naming the node."""
import os
import subprocess

import numpy as np
import pytest

import topiary

torch = pytest.importorskip("torch")
nn = torch.nn


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU6())
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.cat([self.dw(x), torch.relu(self.pw(x))], 1)
        return self.fc(torch.flatten(x, 1))


def test_from_torch_then_export_equals_pytorch(tmp_path, topiary_cli):
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    net = Plain().eval()
    with torch.no_grad():
        net.stem[1].running_mean.uniform_(-0.2, 0.2)
        net.stem[1].running_var.uniform_(0.5, 1.5)
    x = torch.rand(4, 1, 14, 14)
    path = str(tmp_path / "plain.h5")
    summary = topiary.from_torch(net, x[:1], path, topiary_bin=topiary_cli)
    assert summary["classes"] == 10 and (summary["height"], summary["width"]) == (14, 14)
    assert summary["channels"] == 1 and summary["checkpoint"] == path
    ckpt = topiary.load_checkpoint(path)
    assert ckpt.arch == "torch:Plain"
    kinds = [layer["kind"] for layer in ckpt.network["layers"]]
    assert "grouped_conv2d" in kinds and "relu6" in kinds and "concat" in kinds
    onnx_path = str(tmp_path / "plain.onnx")
    subprocess.run([topiary_cli, "export", path, "--onnx", onnx_path, "--batch", "4"], check=True)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    # The export reads raw pixels: mean 0, std 1, max_value 255 means x * 255.
    got = sess.run(None, {"input": (x.numpy() * 255).astype(np.float32)})[0]
    with torch.no_grad():
        want = net(x).numpy()
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_from_torch_refuses_unsupported_operators_by_name(tmp_path, topiary_cli):
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Sigmoid(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    with pytest.raises(topiary.InvalidArgument, match=r"\(Sigmoid\): operator not supported"):
        topiary.from_torch(net, torch.rand(1, 1, 8, 8), str(tmp_path / "s.h5"),
                           topiary_bin=topiary_cli)
    assert not os.path.exists(tmp_path / "s.h5")


def test_daemon_imports_from_its_data_directory_only(daemon, tmp_path):
    """ImportModel: a model in the data directory becomes a new checkpoint there, which a spec
    without model.arch trains from; paths outside, existing outputs and bad files are refused
    with their codes, and the daemon goes on."""
    net = Plain().eval()
    onnx_path = os.path.join(daemon.data_dir, "plain.onnx")
    torch.onnx.export(net, torch.rand(1, 1, 14, 14), onnx_path, opset_version=13)
    with topiary.Client(daemon.address) as c:
        s = c.import_model("plain.onnx", "imports/plain.h5", mean=[0.5], std=[0.25])
        assert s.checkpoint == "imports/plain.h5" and s.classes == 10 and s.layers > 5
        assert "import:onnx" in c.info().capabilities
        report = c.inspect("imports/plain.h5")
        assert report.model_arch == "onnx:plain"
        with pytest.raises(topiary.TopiaryError) as e:
            c.import_model("plain.onnx", "imports/plain.h5")
        assert e.value.code.name == "ALREADY_EXISTS"
        with pytest.raises(topiary.PermissionDenied):
            c.import_model("/etc/passwd", "x.h5")
        with pytest.raises(topiary.PermissionDenied):
            c.import_model("plain.onnx", "../outside.h5")
        with open(os.path.join(daemon.data_dir, "junk.onnx"), "wb") as f:
            f.write(b"\x08\x07junk")
        with pytest.raises(topiary.InvalidArgument, match="not an ONNX model"):
            c.import_model("junk.onnx", "junk.h5")
        assert not os.path.exists(os.path.join(daemon.data_dir, "junk.h5"))
        assert c.info().version  # still serving
