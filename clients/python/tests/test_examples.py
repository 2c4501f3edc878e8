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
