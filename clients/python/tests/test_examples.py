"""examples/pruning_sweep.py end to end, CI-sized: two targets of the half-width resnet20
smoke test on the CPU daemon, results as JSON, the plot written."""
import json
import os
import subprocess
import sys


def test_pruning_sweep(daemon, examples, tmp_path):
    png = tmp_path / "sweep.png"
    env = dict(os.environ, TOPIARY_SERVER=daemon.address, MPLCONFIGDIR=str(tmp_path))
    r = subprocess.run([sys.executable, os.path.join(examples, "pruning_sweep.py"),
                        "--spec", os.path.join(examples, "tiny_block_prune.textproto"),
                        "--targets", "0.25,0.5", "--out", str(png), "--json"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["target"] for row in rows] == [0.25, 0.5]
    assert 0 < rows[0]["sparsity"] < rows[1]["sparsity"] <= 0.5
    assert all(row["rounds"] and 0.1 < row["test_top1"] <= 1 for row in rows)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_torch_import_prune(examples, topiary_cli, tmp_path):
    """examples/torch_import_prune.py, CI-sized: PyTorch training, import, Topiary's evaluation
    equal to PyTorch's, pruning rounds to the target, the export's accuracy in onnxruntime
    equal to the last round's."""
    import pytest
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)")
    env = dict(os.environ, TOPIARY=topiary_cli)
    r = subprocess.run([sys.executable, os.path.join(examples, "torch_import_prune.py"),
                        "--epochs", "1", "--train-limit", "2048", "--test-limit", "500",
                        "--work", str(tmp_path / "work"), "--json"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["topiary_top1"] == out["pytorch_top1"]
    assert out["rounds"][-1]["sparsity"] > 0.3
    assert abs(out["onnx_top1"] - out["rounds"][-1]["test_top1"]) <= 0.004  # 2 of 500 images
