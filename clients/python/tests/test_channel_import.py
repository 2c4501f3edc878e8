"""Channel pruning of imported networks, end to end: a VGG-style network with batch norm and a
MobileNetV2-style one (depthwise convolutions, ReLU6, residual adds), built in PyTorch,
exported to ONNX with their batch norms kept, imported with `topiary import`, pruned to half
of their multiply-adds with `pruning { method: CHANNEL target_flops: 0.5 }` on Fashion-MNIST
(CPU), compacted, and exported again with `topiary export --onnx`. onnxruntime's logits on
the compacted export equal Topiary's own logits for the compacted checkpoint (tests/tools/
onnx_logits, Topiary's CPU engine) within 1e-4 on 1,000 test images, and give the test top-1
the run recorded."""
import json
import os
import subprocess

import numpy as np
import pytest

import topiary
from topiary import datasets

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn

from torch_blocks import InvertedResidual  # noqa: E402 (needs torch)

FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def vgg_bn():
    layers, cin = [], 1
    for v in [16, 16, "M", 32, 32, "M", 48, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            cin = v
    layers += [nn.Flatten(), nn.Linear(48 * 3 * 3, 64), nn.ReLU(inplace=True),
               nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def mobilenet_v2():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True),
        InvertedResidual(16, 16, 1, 1), InvertedResidual(16, 24, 2, 4),
        InvertedResidual(24, 24, 1, 4), InvertedResidual(24, 32, 2, 4),
        InvertedResidual(32, 32, 1, 4),
        nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


@pytest.mark.skipif(not os.path.isdir(FASHION),
                    reason=FASHION + " is missing (Debian: dataset-fashion-mnist)")
@pytest.mark.parametrize("name,build", [("vgg_bn", vgg_bn), ("mobilenet_v2", mobilenet_v2)])
def test_imported_network_prunes_compacts_and_exports(tmp_path, topiary_cli, name, build):
    torch.manual_seed(3)
    net = build().eval()
    onnx_path = str(tmp_path / (name + ".onnx"))
    with torch.no_grad():  # batch norms kept as BatchNormalization nodes: Topiary trains them
        torch.onnx.export(net, torch.zeros(1, 1, 28, 28), onnx_path, opset_version=13,
                          do_constant_folding=False, input_names=["input"],
                          output_names=["logits"])
    dense_path = str(tmp_path / (name + ".h5"))
    summary = topiary.import_onnx(onnx_path, dense_path, mean=[MEAN], std=[STD],
                                  topiary_bin=topiary_cli)
    assert summary["classes"] == 10
    spec = tmp_path / (name + ".textproto")
    spec.write_text(
        f'name: "{name}_channels"\nseed: 2\ninit_from_checkpoint: "{dense_path}"\n'
        'data { dataset: FASHION_MNIST batch_size: 64 train_limit: 3072 test_limit: 1000 }\n'
        'train { optimizer { lr: 0.05 momentum: 0.9 } }\n'
        'pruning { method: CHANNEL target_flops: 0.5 step_fraction: 0.5 finetune_epochs: 1 }\n'
        'device { kind: CPU }\n')
    out = tmp_path / "run"
    lines = _run([topiary_cli, "run", str(spec), "--json", "--out", str(out)]).splitlines()
    run = json.loads(lines[-1])
    assert run["state"] == "SUCCEEDED", run
    rounds = run["rounds"]
    assert int(rounds[-1]["multiply_adds"]) <= 0.5 * int(rounds[0]["multiply_adds"]), rounds
    assert int(rounds[-1]["parameters"]) < int(rounds[0]["parameters"]), rounds

    # The compacted checkpoint's layers are narrower than the imported ones.
    ckpt = topiary.load_checkpoint(run["checkpoint"])
    narrowed = [l for l in ckpt.network["layers"] if l.get("original_out_channels", 0)]
    assert narrowed and all(l["out_channels"] < l["original_out_channels"] for l in narrowed)

    images, labels = datasets.test_set(ckpt)
    assert len(labels) == 1000
    small = str(tmp_path / (name + "_small.onnx"))
    _run([topiary_cli, "export", run["checkpoint"], "--onnx", small, "--batch", "dynamic"])
    session = ort.InferenceSession(small, providers=["CPUExecutionProvider"])
    raw = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
    got = session.run(None, {session.get_inputs()[0].name: raw})[0]

    # Topiary's own logits for the same images, normalized as its batcher does.
    x, logits_path = str(tmp_path / "x.f32"), str(tmp_path / "logits.f32")
    ckpt.input.normalize(images).tofile(x)
    _run([os.environ["TOPIARY_LOGITS"], run["checkpoint"], x, str(len(labels)), logits_path])
    want = np.fromfile(logits_path, dtype=np.float32).reshape(got.shape)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, rel
    assert int(np.sum(got.argmax(1) == labels)) == round(run["test_top1"] * len(labels))
