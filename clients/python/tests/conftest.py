"""Fixtures: a real topiaryd on a free loopback port (its own data directory), the topiary CLI,
the example specs, and checkpoints made by real runs. The binaries come from the environment
(TOPIARYD, TOPIARY, TOPIARY_EXAMPLES), as //clients/python:python_test sets them."""
import os
import shutil
import subprocess
import time

import pytest


def _env_path(name):
    value = os.environ.get(name)
    if not value or not os.path.exists(value):
        raise RuntimeError(f"${name} must name the built file (bazel test //clients/python:"
                           f"python_test sets it); it is {value!r}")
    return os.path.abspath(value)


@pytest.fixture(scope="session")
def topiary_cli():
    return _env_path("TOPIARY")


@pytest.fixture(scope="session")
def examples():
    return _env_path("TOPIARY_EXAMPLES")


class Daemon:
    def __init__(self, root, token=None, tls=None, listen="127.0.0.1:0", extra=(), env=None):
        self.data_dir = os.path.join(root, "data")
        self.log = os.path.join(root, "daemon.log")
        port_file = os.path.join(root, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        args = [_env_path("TOPIARYD"), "--data_dir", self.data_dir, "--listen", listen,
                "--port_file", port_file, "--max_running", "2",
                "--topiary_binary", _env_path("TOPIARY"), *extra]
        self.token_file = None
        if token:
            self.token_file = os.path.join(root, "token")
            with open(self.token_file, "w") as f:
                f.write(token + "\n")
            args += ["--token_file", self.token_file]
        if tls:  # (certificate, key)
            args += ["--tls_cert", tls[0], "--tls_key", tls[1]]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "a"), stderr=subprocess.STDOUT,
                                     env=env)
        for _ in range(200):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"topiaryd exited: {open(self.log).read()}")
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(port_file).read().strip()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("daemon")))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("token_daemon")), token="s3cret-token")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory):
    """A daemon serving TLS with a self-signed certificate for 127.0.0.1; .cert is its PEM."""
    root = tmp_path_factory.mktemp("tls_daemon")
    cert, key = str(root / "cert.pem"), str(root / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    d = Daemon(str(root), tls=(cert, key))
    d.cert = cert
    yield d
    d.stop()


def read_spec(examples, name, **replacements):
    text = open(os.path.join(examples, name)).read()
    for old, new in replacements.items():
        assert old in text, f"{name} has no {old!r}"
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="session")
def runs(tmp_path_factory, topiary_cli, examples):
    """`topiary run` of the lenet5 smoke test and the block-pruned half-width resnet20:
    {name: output folder}."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name in ("tiny", "tiny_block_prune"):
        folder = str(root / name)
        subprocess.run([topiary_cli, "run", os.path.join(examples, name + ".textproto"),
                        "--out", folder], check=True, stdout=subprocess.DEVNULL)
        out[name] = folder
    return out


@pytest.fixture(scope="session")
def pruned_checkpoint(runs):
    folder = os.path.join(runs["tiny_block_prune"], "checkpoints")
    rounds = sorted(f for f in os.listdir(folder) if f.startswith("round-"))
    return os.path.join(folder, rounds[-1])


@pytest.fixture(scope="session")
def lenet_checkpoint(runs):
    return os.path.join(runs["tiny"], "checkpoints", "dense.h5")


@pytest.fixture
def scratch(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


RANKS_SPEC = """
name: "%s" seed: 4
model { arch: "resnet20" width: 0.25 }
data { dataset: SYNTHETIC batch_size: 16
       synthetic { height: 8 width: 8 channels: 2 classes: 3 train_size: 320 test_size: 64 } }
train { epochs: %d optimizer { lr: 0.05 momentum: 0.9 } }
checkpoints { every_epochs: 1 }
device { kind: CPU threads: 1 cpu_ranks: 2 }
"""


def ranks_spec(name, epochs):
    """A quarter-width resnet20 on two CPU ranks, a checkpoint every epoch: the data-parallel
    runs of test_worker.py and test_slurm.py."""
    return RANKS_SPEC % (name, epochs)
