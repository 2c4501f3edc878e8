"""`topiary worker`: one rank per process, CPU ranks through Gloo over loopback. Two processes
train as `topiary run` with two CPU ranks in one process does, bit for bit; a pause signal
stops both at the same step and the run resumes to the same end; a rank killed mid-run fails
the other with a clear message; bad worlds are refused naming the flag or field."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ranks_spec


ENV = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_WAIT_POLICY="PASSIVE")


def events(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def epoch_losses(evs):
    return [(e["train_loss"], e.get("test_loss")) for e in evs if e["event"] == "epoch"]


def summary(evs):
    return [e for e in evs if e["event"] == "summary"][-1]


def start_workers(cli, spec, out, rendezvous, world=2, extra=()):
    return [subprocess.Popen([cli, "worker", spec, "--out", out, "--rank", str(r), "--world",
                              str(world), "--rendezvous", rendezvous, "--json", *extra],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(world)]


def wait_for_checkpoint(procs, out, name):
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "checkpoints", name)):
        assert time.time() < deadline and procs[0].poll() is None, f"no {name}"
        time.sleep(0.05)


def finish(procs, timeout=300):
    return [p.communicate(timeout=timeout) for p in procs]


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.textproto"
    path.write_text(ranks_spec("worker_test", 3))
    return str(path)


def test_two_processes_train_as_two_ranks_in_one(topiary_cli, spec, tmp_path):
    one = subprocess.run([topiary_cli, "run", spec, "--out", str(tmp_path / "one"), "--json"],
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    procs = start_workers(topiary_cli, spec, str(tmp_path / "two"), str(tmp_path / "rv"))
    (out0, err0), (out1, err1) = finish(procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, err0 + err1
    a, b = events(one.stdout), events(out0)
    # The same training bit for bit: the evaluations agree exactly. (The epochs' mean train
    # losses add the same per-step sums in other groups: progress windows every 16 steps
    # instead of every half second, so their last digit may differ.)
    assert len(epoch_losses(a)) == 3
    for (train_a, test_a), (train_b, test_b) in zip(epoch_losses(a), epoch_losses(b)):
        assert test_b == test_a and train_b == pytest.approx(train_a, rel=1e-12)
    s = summary(b)
    assert s["state"] == "SUCCEEDED" and s["test_loss"] == summary(a)["test_loss"]
    assert "rank 0 of 2 processes" in s["device"]
    started = [e for e in b if e["event"] == "started"][0]
    assert started["ranks"] == 2 and "gloo" in started["gradient_reduction"]
    assert [e["ranks_identical"] for e in b if e["event"] == "checkpoint"] == [2, 2, 2]
    # Rank 1 writes nothing and prints only its summary.
    rest = events(out1)
    assert [e["event"] for e in rest] == ["summary"] and rest[0]["state"] == "SUCCEEDED"
    assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == \
        ["dense.h5", "epoch-0001.h5", "epoch-0002.h5"]


def test_pause_signal_stops_every_rank_and_the_run_resumes(topiary_cli, tmp_path):
    spec = tmp_path / "spec.textproto"
    spec.write_text(ranks_spec("worker_test", 40))
    whole = subprocess.run([topiary_cli, "run", str(spec), "--json"], env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr
    out = str(tmp_path / "out")
    procs = start_workers(topiary_cli, str(spec), out, str(tmp_path / "rv1"))
    wait_for_checkpoint(procs, out, "epoch-0002.h5")
    for p in procs:
        p.send_signal(signal.SIGUSR1)
    (out0, err0), (out1, _) = finish(procs)
    assert [summary(events(o))["state"] for o in (out0, out1)] == ["PAUSED", "PAUSED"], err0
    pause = os.path.join(out, "checkpoints", "pause.h5")
    assert os.path.exists(pause)
    procs = start_workers(topiary_cli, str(spec), out, str(tmp_path / "rv2"),
                          extra=("--resume", pause))
    (out0, err0), _ = finish(procs, timeout=600)
    assert procs[0].returncode == 0, err0
    assert summary(events(out0))["test_loss"] == summary(events(whole.stdout))["test_loss"]


def test_a_killed_rank_fails_the_other_with_a_clear_message(topiary_cli, tmp_path):
    spec = tmp_path / "spec.textproto"
    spec.write_text(ranks_spec("worker_test", 40))
    out = str(tmp_path / "out")
    procs = start_workers(topiary_cli, str(spec), out, str(tmp_path / "rv"))
    wait_for_checkpoint(procs, out, "epoch-0001.h5")
    procs[1].kill()
    out0, err0 = procs[0].communicate(timeout=120)
    assert procs[0].returncode != 0
    s = summary(events(out0))
    assert s["state"] == "FAILED" and "gloo" in s["error"], s["error"]
    # What was written stays readable: the last checkpoint, the event log.
    assert os.path.getsize(os.path.join(out, "checkpoints", "epoch-0001.h5")) > 0


def test_bad_worlds_are_refused(topiary_cli, spec, tmp_path):
    r = subprocess.run([topiary_cli, "worker", spec, "--rank", "2", "--world", "2",
                        "--rendezvous", str(tmp_path)], env=ENV, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "--rank" in r.stderr
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}
    r = subprocess.run([topiary_cli, "worker", spec], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "SLURM_PROCID" in r.stderr
    # The spec's two CPU ranks cannot be three processes.
    procs = start_workers(topiary_cli, spec, str(tmp_path / "o"), str(tmp_path / "rv"), world=3)
    outs = finish(procs, timeout=120)
    for p, (o, e) in zip(procs, outs):
        assert p.returncode != 0
        assert "device.cpu_ranks" in summary(events(o))["error"]
