"""Forks that do what they say (a real topiaryd): an inherited block dropped or replaced whole,
train.epochs honoured, and the fine-tuning of a pruned checkpoint labelled as such, not as a
dense phase; --set errors name the path."""
import pytest

import topiary
from topiary.v1 import events_pb2


def test_fork_drops_replaces_and_fine_tunes(daemon, pruned_checkpoint):
    with topiary.Client(daemon.address) as c:
        c.upload(pruned_checkpoint, "forks/pruned.h5")
        parent = topiary.load_checkpoint(pruned_checkpoint)
        # Pruning dropped, one epoch of fine-tuning asked for, a multiplier block replaced in.
        child = c.fork("forks/pruned.h5", ["pruning=none", "train.epochs=1",
                                           'approximation={rules {layer: "*" '
                                           'multiplier: "drum:6"}}'], name="finetune")
        assert not child.spec.HasField("pruning") and child.spec.train.epochs == 1
        assert [r.multiplier for r in child.spec.approximation.rules][0].endswith("drum:6")
        done = c.wait(child.id, timeout=300)
        assert done.state == topiary.SUCCEEDED, done.error
        events = list(c.watch(child.id))
        epochs = [e.epoch for e in events if e.WhichOneof("kind") == "epoch"]
        assert len(epochs) == 1
        assert epochs[0].training_phase.kind == events_pb2.Phase.START_FINE_TUNE
        # The masks came along: the fine-tuned model is as sparse as its parent.
        assert done.sparsity == pytest.approx(parent.sparsity(), abs=1e-6)
        names = [k.path.rsplit("/", 1)[-1] for k in c.checkpoints(child.id)]
        assert "finetune.h5" in names and "dense.h5" not in names
        # A pruning fork without train.epochs does not retrain its parent's dense phase.
        again = c.fork("forks/pruned.h5", ["pruning.target=0.75"], name="more")
        assert again.spec.train.epochs == 0
        done = c.wait(again.id, timeout=300)
        assert done.state == topiary.SUCCEEDED
        evs = list(c.watch(again.id))
        phases = {e.WhichOneof("kind"): set() for e in evs}
        for e in evs:
            if e.WhichOneof("kind") in ("epoch", "progress"):
                phases[e.WhichOneof("kind")].add(getattr(e, e.WhichOneof("kind"))
                                                 .training_phase.kind)
        trained = phases.get("epoch", set()) | phases.get("progress", set())
        assert trained == {events_pb2.Phase.FINE_TUNE}, phases
        assert sum(e.WhichOneof("kind") == "round" for e in evs) >= 2
        with pytest.raises(topiary.InvalidArgument) as e:
            c.fork("forks/pruned.h5", ["pruning.targt=0.6"])
        assert "pruning has no field 'targt'" in str(e.value)
