"""topiaryd --scheduler slurm on a real one-node Slurm cluster (scripts/slurm_local.sh: munge,
slurmctld and slurmd from Debian's packages, started for this module and stopped after it).
A 2-task CPU experiment submitted through the CLI trains as the in-process 2-rank run does;
cancel and pause (then resume) work; a task killed mid-run fails the experiment with a clear
message and leaves the daemon serving. Skips, saying why, where Slurm is not installed."""
import json
import os
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import Daemon, ranks_spec



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    script = os.environ.get("TOPIARY_SLURM_LOCAL", "")
    if not os.path.exists(script):
        pytest.skip(f"$TOPIARY_SLURM_LOCAL does not name scripts/slurm_local.sh ({script!r})")
    folder = tempfile.mkdtemp(prefix="tsl.", dir="/tmp")  # short: munge's socket is there
    r = subprocess.run([script, "start", folder, str(free_port()), str(free_port())],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, SLURM_CONF=os.path.join(folder, "slurm.conf"), GLOO_SOCKET_IFNAME="lo",
               OMP_WAIT_POLICY="PASSIVE")
    yield env
    subprocess.run([script, "stop", folder], timeout=60)


@pytest.fixture(scope="module")
def slurm_daemon(cluster, tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("slurm_daemon")), extra=("--scheduler", "slurm"),
               env=cluster)
    d.env = cluster
    yield d
    d.stop()


def cli(topiary_cli, daemon, *args, timeout=300):
    r = subprocess.run([topiary_cli, *args, "--server", daemon.address, "--json"],
                       env=daemon.env, capture_output=True, text=True, timeout=timeout)
    return r


def submit(topiary_cli, daemon, tmp_path, name, epochs):
    spec = tmp_path / f"{name}.textproto"
    spec.write_text(ranks_spec("slurm_" + name, epochs))
    r = cli(topiary_cli, daemon, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])["id"], spec


def get(topiary_cli, daemon, id):
    r = cli(topiary_cli, daemon, "get", id)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def wait_for(topiary_cli, daemon, id, done, timeout=240):
    deadline = time.time() + timeout
    while True:
        e = get(topiary_cli, daemon, id)
        if done(e):
            return e
        assert time.time() < deadline, f"{id} stayed {e.get('state')}: {e}"
        time.sleep(0.5)


def events(topiary_cli, daemon, id):
    r = cli(topiary_cli, daemon, "watch", id)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_a_two_task_job_trains_as_two_ranks_in_one_process(topiary_cli, slurm_daemon, tmp_path):
    id, spec = submit(topiary_cli, slurm_daemon, tmp_path, "same", 3)
    e = wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] in ("SUCCEEDED", "FAILED"))
    assert e["state"] == "SUCCEEDED", e
    assert e["slurm_job_id"]
    local = subprocess.run([topiary_cli, "run", str(spec), "--json"], env=slurm_daemon.env,
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    mine = [json.loads(line) for line in local.stdout.splitlines() if line.startswith("{")]
    theirs = events(topiary_cli, slurm_daemon, id)
    test_losses = lambda evs: [x["test_loss"] for x in evs if x["event"] == "epoch"]
    assert test_losses(theirs) == test_losses(mine) and len(test_losses(mine)) == 3
    started = [x for x in theirs if x["event"] == "started"][0]
    assert started["ranks"] == 2 and "gloo" in started["gradient_reduction"]
    # The Python client sees it as it sees a local experiment.
    import topiary
    with topiary.Client(slurm_daemon.address) as client:
        record = client.get(id)
        assert record.slurm_job_id == e["slurm_job_id"] and record.epoch == 3
        watched = list(client.watch(id))
        assert [x.epoch.test_loss for x in watched if x.HasField("epoch")] == test_losses(mine)
        assert watched[-1].HasField("state") or watched[-1].HasField("summary")
    # The experiment's folder holds what a local run's does: checkpoints and the job's output.
    folder = os.path.join(slurm_daemon.data_dir, e["folder"])
    assert os.path.exists(os.path.join(folder, "checkpoints", "dense.h5"))
    assert os.path.exists(os.path.join(folder, "slurm", f"job-{e['slurm_job_id']}.out"))


def test_cancel_and_pause_map_to_slurm(topiary_cli, slurm_daemon, tmp_path):
    running = lambda e: e["state"] == "RUNNING" and e.get("epoch", 0) >= 1
    id, _ = submit(topiary_cli, slurm_daemon, tmp_path, "cancel", 200)
    wait_for(topiary_cli, slurm_daemon, id, running)
    assert cli(topiary_cli, slurm_daemon, "cancel", id).returncode == 0
    e = wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] not in ("RUNNING", "QUEUED"))
    assert e["state"] == "CANCELLED", e
    job = e["slurm_job_id"]
    squeue = subprocess.run(["squeue", "--noheader", f"--jobs={job}"], env=slurm_daemon.env,
                            capture_output=True, text=True)
    assert squeue.stdout.strip() == "", squeue.stdout

    id, _ = submit(topiary_cli, slurm_daemon, tmp_path, "pause", 6)
    wait_for(topiary_cli, slurm_daemon, id, running)
    assert cli(topiary_cli, slurm_daemon, "pause", id).returncode == 0
    e = wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] not in ("RUNNING", "QUEUED"))
    assert e["state"] == "PAUSED" and e["last_checkpoint"].endswith("pause.h5"), e
    assert cli(topiary_cli, slurm_daemon, "resume", id).returncode == 0
    e = wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] in ("SUCCEEDED", "FAILED"))
    assert e["state"] == "SUCCEEDED" and e["epoch"] == 6, e
    assert e["slurm_job_id"] != job


def test_a_killed_task_fails_the_experiment_and_the_daemon_serves_on(topiary_cli, slurm_daemon,
                                                                     tmp_path):
    id, _ = submit(topiary_cli, slurm_daemon, tmp_path, "killed", 200)
    wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] == "RUNNING" and e["epoch"] >= 1)
    # Rank 1's process: the worker of this experiment whose environment says SLURM_PROCID=1.
    pids = subprocess.run(["pgrep", "-f", "--", f"--experiment {id}"], capture_output=True,
                          text=True).stdout.split()
    victim = None
    for pid in pids:
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"SLURM_PROCID=1" in env:
            victim = int(pid)
    assert victim, f"no rank 1 among {pids}"
    os.kill(victim, 9)
    e = wait_for(topiary_cli, slurm_daemon, id, lambda e: e["state"] not in ("RUNNING", "QUEUED"))
    assert e["state"] == "FAILED", e
    assert "gloo" in e["error"] or "slurm job" in e["error"], e["error"]
    # Nothing lost: the checkpoints written, and the daemon answers.
    assert e["last_checkpoint"].endswith(".h5")
    assert cli(topiary_cli, slurm_daemon, "list").returncode == 0


def test_a_restarted_daemon_follows_the_running_job(topiary_cli, cluster, tmp_path):
    """kill -9 of the daemon leaves the job running; the next start (same data directory and
    address) follows that job to its end instead of submitting another."""
    root, listen = str(tmp_path / "d"), f"127.0.0.1:{free_port()}"
    os.makedirs(root)
    d = Daemon(root, listen=listen, extra=("--scheduler", "slurm"), env=cluster)
    d.env = cluster
    id, _ = submit(topiary_cli, d, tmp_path, "restart", 12)
    first = wait_for(topiary_cli, d, id, lambda e: e["state"] == "RUNNING" and e["epoch"] >= 1)
    d.stop()  # SIGKILL
    d = Daemon(root, listen=listen, extra=("--scheduler", "slurm"), env=cluster)
    d.env = cluster
    try:
        e = wait_for(topiary_cli, d, id, lambda e: e["state"] in ("SUCCEEDED", "FAILED"))
        assert e["state"] == "SUCCEEDED" and e["epoch"] == 12, e
        assert e["slurm_job_id"] == first["slurm_job_id"]
        assert "following its Slurm job" in open(d.log).read()
    finally:
        d.stop()
