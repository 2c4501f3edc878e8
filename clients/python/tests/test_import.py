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


class SqueezeExcite(nn.Module):
    def __init__(self, c, gate):
        super().__init__()
        self.reduce = nn.Conv2d(c, c // 2, 1)
        self.act = nn.LeakyReLU(0.1)
        self.expand = nn.Conv2d(c // 2, c, 1)
        self.gate = gate

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class Mobile(nn.Module):
    """MobileNetV3- and EfficientNet-flavoured: SiLU, hard swish, squeeze-and-excitation with a
    hard-sigmoid gate and with a sigmoid one, leaky ReLU, batch norm after every convolution."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False),
                                nn.BatchNorm2d(8), nn.Hardswish())
        self.se1 = SqueezeExcite(8, nn.Hardsigmoid())
        self.pw = nn.Sequential(nn.Conv2d(8, 12, 1, bias=False), nn.BatchNorm2d(12), nn.SiLU())
        self.se2 = SqueezeExcite(12, nn.Sigmoid())
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        x = self.se2(self.pw(self.se1(self.dw(self.stem(x)))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_mobile_operators_import_train_and_come_back(tmp_path, topiary_cli):
    """SiLU, Hardswish, Hardsigmoid, Sigmoid, LeakyReLU and squeeze-and-excitation products
    come in; batch norms stay layers named as the module names them; Topiary's logits (through
    its ONNX export in onnxruntime) and to_torch_model's equal PyTorch's; and the network
    fine-tunes on the CPU (the backward passes of every new layer)."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(1)
    net = Mobile().eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
    x = torch.rand(4, 1, 14, 14) * 4 - 2
    path = str(tmp_path / "mobile.h5")
    topiary.from_torch(net, x[:1], path, topiary_bin=topiary_cli)
    ckpt = topiary.load_checkpoint(path)
    layers = {layer["name"]: layer["kind"] for layer in ckpt.network["layers"]}
    for name, kind in {"stem.0": "conv2d", "stem.1": "batch_norm", "stem.2": "silu",
                       "dw.2": "hard_swish", "se1.act": "leaky_relu", "pw.1": "batch_norm",
                       "fc": "linear"}.items():
        assert layers.get(name) == kind, (name, layers)
    kinds = list(layers.values())
    assert kinds.count("mul") == 2 and "hard_sigmoid" in kinds and "sigmoid" in kinds
    assert kinds.count("batch_norm") == 3
    with torch.no_grad():
        want = net(x).numpy()
    onnx_path = str(tmp_path / "mobile.onnx")
    subprocess.run([topiary_cli, "export", path, "--onnx", onnx_path, "--batch", "4"], check=True)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": (x.numpy() * 255).astype(np.float32)})[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    back = topiary.to_torch_model(ckpt).eval()
    with torch.no_grad():
        again = back(x).numpy()
    assert np.abs(again - want).max() <= 1e-4 * np.abs(want).max()
    # Back into a fresh Mobile by name (no name map): the same logits.
    fresh = Mobile().eval()
    topiary.to_torch(path, fresh)
    with torch.no_grad():
        assert np.abs(fresh(x).numpy() - want).max() <= 1e-4 * np.abs(want).max()
    # Folding stays an option: fewer batch norms.
    folded = str(tmp_path / "folded.h5")
    topiary.from_torch(net, x[:1], folded, topiary_bin=topiary_cli, fold_batch_norm=True)
    fk = [layer["kind"] for layer in topiary.load_checkpoint(folded).network["layers"]]
    assert fk.count("batch_norm") == 0
    # A few fine-tuning steps on synthetic images, every new layer's backward included.
    spec = tmp_path / "tune.textproto"
    spec.write_text(f'name: "tune" seed: 1 init_from_checkpoint: "{path}"\n'
                    'data { dataset: SYNTHETIC batch_size: 16 synthetic { height: 14 width: 14 '
                    'channels: 1 classes: 10 train_size: 64 test_size: 32 } }\n'
                    'train { epochs: 2 optimizer { lr: 0.05 } } device { kind: CPU }\n')
    out = subprocess.run([topiary_cli, "run", str(spec), "--json"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()
    import json
    summary = [json.loads(line) for line in out if '"summary"' in line][-1]
    assert summary["state"] == "SUCCEEDED", summary
    epochs = [json.loads(line) for line in out if '"epoch"' in line and '"train_loss"' in line]
    assert len(epochs) == 2 and epochs[1]["train_loss"] < epochs[0]["train_loss"], epochs


def test_from_torch_refuses_unsupported_operators_by_name(tmp_path, topiary_cli):
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    with pytest.raises(topiary.InvalidArgument, match=r"\(Tanh\): operator not supported"):
        topiary.from_torch(net, torch.rand(1, 1, 8, 8), str(tmp_path / "s.h5"),
                           topiary_bin=topiary_cli)
    assert not os.path.exists(tmp_path / "s.h5")
    # Attributes out of range: refused by the graph's checks, naming the layer.
    steep = nn.Sequential(nn.Conv2d(1, 4, 3), nn.LeakyReLU(1000.0), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 3))
    with pytest.raises(topiary.InvalidArgument, match=r"layer '1'.*alpha = 1000"):
        topiary.from_torch(steep, torch.rand(1, 1, 8, 8), str(tmp_path / "l.h5"),
                           topiary_bin=topiary_cli)
    assert not os.path.exists(tmp_path / "l.h5")


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
