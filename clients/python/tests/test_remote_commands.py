"""evaluate, sensitivity and export run in a real topiaryd (`--remote`, Client.evaluate /
sensitivity / export_onnx): the same output as the same command run locally, on a checkpoint
uploaded into the daemon's data directory; and the requests the daemon refuses."""
import json
import os
import subprocess

import grpc
import pytest

import topiary
from topiary.v1 import service_pb2 as pb
from topiary.v1 import service_pb2_grpc


def run(*args, ok=True):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr + r.stdout
    return r


def without_path(rows):
    return [{k: v for k, v in row.items() if k != "checkpoint"} for row in rows]


@pytest.fixture(scope="module")
def uploaded(daemon, pruned_checkpoint):
    with topiary.Client(daemon.address) as c:
        c.upload(pruned_checkpoint, "models/pruned.h5")
    return "models/pruned.h5"


def test_remote_evaluate_matches_local(daemon, topiary_cli, pruned_checkpoint, uploaded):
    flags = ["--multipliers", "mul8u_L40,drum:6", "--weight_code", "asymmetric,sign_magnitude",
             "--json"]
    local = [json.loads(l) for l in
             run(topiary_cli, "evaluate", pruned_checkpoint, *flags).stdout.splitlines()]
    remote = [json.loads(l) for l in
              run(topiary_cli, "evaluate", "--remote", uploaded, *flags, "--server",
                  daemon.address).stdout.splitlines()]
    assert len(remote) == 4 and without_path(remote) == without_path(local)
    assert remote[0]["checkpoint"] == uploaded
    # The text table too, apart from the checkpoint's name in its first line.
    text_flags = ["--multipliers", "mul8u_L40"]
    local_text = run(topiary_cli, "evaluate", pruned_checkpoint, *text_flags).stdout
    remote_text = run(topiary_cli, "evaluate", uploaded, "--remote", *text_flags, "--server",
                      daemon.address).stdout
    assert remote_text.splitlines()[1:] == local_text.splitlines()[1:]
    with topiary.Client(daemon.address) as c:
        rows = c.evaluate(uploaded, multipliers=["mul8u_L40", "drum:6"],
                          weight_code=["asymmetric", "sign_magnitude"])
        assert without_path(rows) == without_path(local)
        one = c.evaluate(uploaded)
        assert len(one) == 1 and 0.5 < one[0]["top1"] <= 1
        with pytest.raises(topiary.NotFound):
            c.evaluate("models/none.h5")
        with pytest.raises(topiary.InvalidArgument) as e:
            c.evaluate(uploaded, multipliers=["no_such_multiplier"])
        assert "no_such_multiplier" in str(e.value)


def test_remote_sensitivity_and_export(daemon, topiary_cli, pruned_checkpoint, uploaded,
                                       tmp_path):
    with topiary.Client(daemon.address) as c:
        remote = c.sensitivity(uploaded, ["mul8u_L40"], budget=2)
    local = json.loads(run(topiary_cli, "sensitivity", pruned_checkpoint, "mul8u_L40",
                           "--budget", "2", "--json").stdout)
    assert without_path([remote]) == without_path([local])
    # export: a new file in the data directory, the same bytes as a local export.
    r = run(topiary_cli, "export", "--remote", uploaded, "--onnx", "exports/pruned.onnx",
            "--json", "--server", daemon.address)
    assert json.loads(r.stdout)["nodes"] > 0
    run(topiary_cli, "export", pruned_checkpoint, "--onnx", str(tmp_path / "local.onnx"))
    run(topiary_cli, "download", "exports/pruned.onnx", str(tmp_path / "remote.onnx"),
        "--server", daemon.address)
    assert open(str(tmp_path / "remote.onnx"), "rb").read() == \
        open(str(tmp_path / "local.onnx"), "rb").read()
    with topiary.Client(daemon.address) as c:
        summary = c.export_onnx(uploaded, "exports/pruned_b4.onnx", batch=4)
        assert summary["nodes"] > 0
        with pytest.raises(topiary.TopiaryError) as e:  # never over a file
            c.export_onnx(uploaded, "exports/pruned.onnx")
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS


def test_remote_commands_refused(daemon, topiary_cli, uploaded, tmp_path):
    stub = service_pb2_grpc.TopiaryStub(grpc.insecure_channel(daemon.address))

    def refused(command, args, code, words):
        with pytest.raises(grpc.RpcError) as e:
            list(stub.RunCommand(pb.RunCommandRequest(command=command, args=args)))
        assert e.value.code() == code, e.value.details()
        for w in words:
            assert w in e.value.details(), e.value.details()

    refused("run", ["spec.textproto"], grpc.StatusCode.INVALID_ARGUMENT, ["does not run"])
    refused("evaluate", [uploaded, "--server", "127.0.0.1:1"], grpc.StatusCode.INVALID_ARGUMENT,
            ["--server is not taken"])
    refused("evaluate", [uploaded, "--remote"], grpc.StatusCode.INVALID_ARGUMENT, ["--remote"])
    refused("evaluate", ["/etc/passwd"], grpc.StatusCode.PERMISSION_DENIED, ["outside"])
    refused("evaluate", ["--json"], grpc.StatusCode.INVALID_ARGUMENT, ["name a checkpoint"])
    refused("export", [uploaded, "--onnx", "experiments/x.onnx"],
            grpc.StatusCode.PERMISSION_DENIED, ["experiments/"])
    refused("export", [uploaded, "--onnx", "/tmp/x.onnx"], grpc.StatusCode.INVALID_ARGUMENT,
            ["absolute"])
    refused("export", [uploaded, "--onnx", "../x.onnx"], grpc.StatusCode.INVALID_ARGUMENT, ["'..'"])
    refused("sensitivity", [uploaded, "mul8u_L40", "--budget"],
            grpc.StatusCode.INVALID_ARGUMENT, ["needs a value"])
    # A multiplier file outside the data directory is refused by the command's read policy.
    table = tmp_path / "exact.bin"  # an exact 8x8-bit table, outside the data directory
    table.write_bytes(b"".join((a * w).to_bytes(2, "little") for a in range(256)
                               for w in range(256)))
    r = run(topiary_cli, "evaluate", "--remote", uploaded, "--set", f"*={table}",
            "--server", daemon.address, ok=False)
    assert r.returncode != 0 and "outside" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(daemon.data_dir, "x.onnx"))
