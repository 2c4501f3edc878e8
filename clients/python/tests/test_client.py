"""The client against a real topiaryd over loopback: submit, watch to the end (and resume a
watch), manual rounds, fork, pause/resume, errors as exceptions with code and field, token
auth and the environment variables."""

import grpc
import pytest

import topiary
from topiary.v1 import experiment_pb2
from topiary.v1 import service_pb2 as pb

from conftest import Daemon, read_spec


def kinds(events):
    return [e.WhichOneof("kind") for e in events]


def test_submit_watch_to_the_end(daemon, examples):
    with topiary.Client(daemon.address) as c:
        exp = c.submit(read_spec(examples, "tiny.textproto"))
        assert exp.id and exp.spec.data.batch_size == 64
        events = list(c.watch(exp.id))
        seqs = [e.seq for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 1
        assert "started" in kinds(events) and "epoch" in kinds(events)
        summary = [e.summary for e in events if e.WhichOneof("kind") == "summary"]
        assert summary and summary[-1].state == topiary.SUCCEEDED
        done = c.get(exp.id)
        assert done.state == topiary.SUCCEEDED and done.test_top1 == pytest.approx(summary[-1].test_top1)
        assert done.test_top1 > 0.5
        # Resumable: from any sequence number, exactly the events after it.
        k = seqs[len(seqs) // 2]
        assert [e.seq for e in c.watch(exp.id, from_seq=k)] == [s for s in seqs if s > k]
        assert [e.SerializeToString() for e in c.watch(exp.id, from_seq=k)] == \
               [e.SerializeToString() for e in events if e.seq > k]


def test_submit_forms_and_list(daemon, examples):
    text = read_spec(examples, "tiny.textproto", **{"epochs: 2": "epochs: 1"})
    spec = topiary.parse_spec(text)
    with topiary.Client(daemon.address) as c:
        from google.protobuf import json_format
        as_dict = json_format.MessageToDict(spec)
        as_dict["name"] = "from-dict"
        ids = [c.submit(spec).id, c.submit(as_dict).id, c.submit(json_format.MessageToJson(spec)).id]
        for i in ids:
            assert c.wait(i, timeout=120).state == topiary.SUCCEEDED
        listed = [e.id for e in c.list()]
        assert all(i in listed for i in ids) and listed == sorted(listed)
        assert c.get(ids[1]).name == "from-dict"
        assert {e.id for e in c.list("SUCCEEDED")} >= set(ids)
        assert not any(e.id in ids for e in c.list(topiary.FAILED))


def test_errors_are_exceptions_with_code_and_field(daemon, examples):
    with topiary.Client(daemon.address) as c:
        bad = read_spec(examples, "tiny.textproto", **{"batch_size: 64": "batch_size: -3"})
        with pytest.raises(topiary.InvalidArgument) as e:
            c.submit(bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.field == "data.batch_size", e.value.message
        # A dataset folder that is not there: refused at submission, not when the run starts.
        gone = read_spec(examples, "tiny.textproto",
                         **{"data {": 'data { path: "/usr/share/datasets/no-such-dataset"'})
        with pytest.raises(topiary.InvalidArgument) as e:
            c.submit(gone)
        assert e.value.field == "data.path" and "does not exist" in e.value.message, e.value
        with pytest.raises(topiary.InvalidArgument) as e:
            c.submit("model { arch: ")  # not even text format: refused before sending
        assert e.value.field == "spec"
        with pytest.raises(topiary.NotFound) as e:
            c.get("exp-9999")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        done = c.submit(read_spec(examples, "tiny.textproto", **{"epochs: 2": "epochs: 1"}))
        c.wait(done.id, timeout=120)
        with pytest.raises(topiary.FailedPrecondition):
            c.resume(done.id)
        with pytest.raises(topiary.FailedPrecondition):
            c.advance_round(done.id)
        with pytest.raises(topiary.PermissionDenied) as e:
            c.inspect("../../../etc/passwd")
        assert e.value.field == "path", e.value.message
        with pytest.raises(topiary.InvalidArgument) as e:
            c.fork(c.checkpoints(done.id)[-1].path, {"pruning.target": 1.5})
        assert e.value.field == "pruning.target", e.value.message
        assert isinstance(e.value, topiary.TopiaryError)
    with topiary.Client("127.0.0.1:1", timeout=3) as c:
        with pytest.raises(topiary.Unavailable) as e:
            c.list()
        assert "no topiaryd at 127.0.0.1:1" in str(e.value)


def test_manual_rounds_can_finish(daemon, examples):
    spec = read_spec(examples, "tiny_block_prune.textproto",
                     **{"finetune_epochs: 1 }": "finetune_epochs: 1 manual_rounds: true }"})
    with topiary.Client(daemon.address) as c:
        exp = c.submit(spec)
        c.wait(exp.id, ["WAITING_FOR_ROUND"], timeout=300)
        with pytest.raises(topiary.InvalidArgument):
            c.advance_round(exp.id, finish=True, target=0.5)
        c.advance_round(exp.id, finish=True)
        done = c.wait(exp.id, timeout=300)
        assert done.state == topiary.SUCCEEDED and done.round == 0
        summary = [e.summary for e in c.watch(exp.id) if e.WhichOneof("kind") == "summary"][-1]
        assert not summary.target_reached and "client ended the rounds" in summary.target_note


def test_manual_rounds_and_fork(daemon, examples):
    spec = read_spec(examples, "tiny_block_prune.textproto",
                     **{"finetune_epochs: 1 }": "finetune_epochs: 1 manual_rounds: true }"})
    with topiary.Client(daemon.address) as c:
        exp = c.submit(spec)
        c.wait(exp.id, ["WAITING_FOR_ROUND"], timeout=300)
        with pytest.raises(topiary.InvalidArgument) as e:
            c.advance_round(exp.id, target=1.5)
        assert e.value.field == "target"
        c.advance_round(exp.id, target=0.25, step_fraction=1.0, finetune_epochs=1)
        after = c.wait(exp.id, ["WAITING_FOR_ROUND", "SUCCEEDED"], timeout=300)
        # The sparsity counts every conv and linear kernel; the stem and fc stay dense.
        assert after.round == 1 and 0.15 < after.sparsity <= 0.25
        assert after.spec.pruning.target == pytest.approx(0.25)
        while after.state == topiary.WAITING_FOR_ROUND:
            c.advance_round(exp.id)
            after = c.wait(exp.id, ["WAITING_FOR_ROUND", "SUCCEEDED"], timeout=300)
        assert after.state == topiary.SUCCEEDED
        rounds = [e.round for e in c.watch(exp.id) if e.WhichOneof("kind") == "round"]
        assert [r.round for r in rounds] == list(range(len(rounds))) and len(rounds) >= 2

        ckpts = c.checkpoints(exp.id)
        assert ckpts and ckpts[-1].round == after.round
        child = c.fork(ckpts[-1].path, {"pruning.target": 0.5, "pruning.manual_rounds": False},
                       name="forked")
        assert child.parent == ckpts[-1].path and child.name == "forked"
        assert child.spec.pruning.target == pytest.approx(0.5)
        done = c.wait(child.id, timeout=300)
        assert done.state == topiary.SUCCEEDED and after.sparsity < done.sparsity <= 0.5
        report = c.inspect(c.checkpoints(child.id)[-1].path)
        assert report.model_arch == "resnet20" and report.sparsity == pytest.approx(done.sparsity)


def test_watch_survives_a_daemon_restart(tmp_path, examples):
    """kill -9 of the daemon mid-watch, a new daemon on the same port and data directory: the
    watch reconnects and continues after the last event it gave, without gaps or repeats."""
    d = Daemon(str(tmp_path))
    try:
        with topiary.Client(d.address) as c:
            exp = c.submit(read_spec(examples, "tiny.textproto", **{"epochs: 2": "epochs: 20"}))
            seqs, started, restarted = [], 0, False
            for e in c.watch(exp.id, reconnect_seconds=60):
                seqs.append(e.seq)
                started += e.WhichOneof("kind") == "started"
                if not restarted and e.WhichOneof("kind") == "epoch":
                    d.stop()  # SIGKILL
                    d = Daemon(str(tmp_path), listen=d.address)
                    restarted = True
            assert restarted and seqs == list(range(1, len(seqs) + 1))
            done = c.get(exp.id)
            # The new daemon ran the experiment again (from its last checkpoint): two starts.
            assert done.state == topiary.SUCCEEDED and started == 2 and done.last_seq == seqs[-1]
    finally:
        d.stop()


def test_pause_resume_cancel(daemon, examples):
    spec = read_spec(examples, "tiny.textproto", **{"epochs: 2": "epochs: 30"})
    with topiary.Client(daemon.address) as c:
        exp = c.submit(spec)
        for e in c.watch(exp.id):  # paused mid-run, after the first progress report
            if e.WhichOneof("kind") in ("progress", "epoch"):
                break
        c.pause(exp.id)
        paused = c.wait(exp.id, ["PAUSED"], timeout=120)
        assert 0 <= paused.epoch < 30
        c.resume(exp.id)
        c.wait(exp.id, ["RUNNING"], timeout=60)
        assert c.cancel(exp.id).id == exp.id
        assert c.wait(exp.id, ["CANCELLED"], timeout=120).state == topiary.CANCELLED


def test_daemon_queries(daemon):
    with topiary.Client(daemon.address) as c:
        info = c.info()
        assert info.version and info.devices and info.max_running == 2
        # Derived from the spec the daemon accepts: what was missing from the hand-written list.
        caps = set(info.capabilities)
        for cap in ("precision:BF16", "spec:gradient_sampling", "spec:approximation",
                    "pruning:N_OF_M", "data_parallel", "model:resnet50", "dataset:FASHION_MNIST"):
            assert cap in caps, (cap, sorted(caps))
        assert not any(c.endswith("UNSPECIFIED") for c in caps)
        # Pages: the client follows next_page_token.
        assert [e.id for e in c.list()] == sorted(e.id for e in c.list())
        m = c.multipliers()
        assert "exact" in list(m.families)


def test_token_auth_and_environment(token_daemon, examples, monkeypatch, tmp_path):
    with topiary.Client(token_daemon.address) as c:
        with pytest.raises(topiary.Unauthenticated) as e:
            c.list()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    with topiary.Client(token_daemon.address, token_file=str(wrong)) as c:
        with pytest.raises(topiary.Unauthenticated):
            c.list()
    with topiary.Client(token_daemon.address, token_file=token_daemon.token_file) as c:
        assert c.list() == []
    with pytest.raises(topiary.InvalidArgument) as e:
        topiary.Client(token_daemon.address, token_file=str(tmp_path / "missing"))
    assert e.value.field == "token_file"
    monkeypatch.setenv("TOPIARY_SERVER", token_daemon.address)
    monkeypatch.setenv("TOPIARY_TOKEN_FILE", token_daemon.token_file)
    with topiary.Client() as c:
        assert c.server == token_daemon.address
        exp = c.submit(read_spec(examples, "tiny.textproto", **{"epochs: 2": "epochs: 1"}))
        assert c.wait(exp.id, timeout=120).state == topiary.SUCCEEDED


def test_tls(tls_daemon):
    with topiary.Client(tls_daemon.address, tls_ca=tls_daemon.cert) as c:
        assert c.list() == [] and c.info().version
    with topiary.Client(tls_daemon.address, timeout=5) as c:  # plaintext to a TLS port
        with pytest.raises(topiary.Unavailable):
            c.list()


def test_parse_spec_forms():
    spec = topiary.parse_spec({"model": {"arch": "lenet5"}, "data": {"batchSize": 32}})
    assert isinstance(spec, experiment_pb2.ExperimentSpec) and spec.data.batch_size == 32
    assert topiary.parse_spec(spec) is spec
    assert topiary.parse_spec('{"model": {"arch": "resnet20"}}').model.arch == "resnet20"
    with pytest.raises(topiary.InvalidArgument):
        topiary.parse_spec({"model": {"no_such_field": 1}})
    with pytest.raises(TypeError):
        topiary.parse_spec(42)
