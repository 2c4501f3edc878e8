"""Client: the Topiary service (protos/topiary/v1/service.proto) over gRPC.

    from topiary import Client
    with Client() as c:                       # $TOPIARY_SERVER or 127.0.0.1:7077
        exp = c.submit(open("spec.textproto").read())
        for event in c.watch(exp.id):         # until it ends; resumable with from_seq
            print(event.seq, event.WhichOneof("kind"))
        print(c.get(exp.id).test_top1)

Results are the service's protobuf messages (topiary.v1.service_pb2.Experiment, Event,
CheckpointInfo, ...), whose fields the .proto files document. Failures raise
topiary.errors.TopiaryError subclasses carrying the gRPC code and the field the server named.
"""
from __future__ import annotations

import json
import os
import time
from typing import Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Union

import grpc
from google.protobuf import json_format, text_format

from topiary.errors import (FailedPrecondition, InvalidArgument, TopiaryError, Unavailable,
                            from_code, from_rpc_error)
from topiary.v1 import (checkpoint_pb2, events_pb2, experiment_pb2, multiplier_pb2,
                        network_pb2)
from topiary.v1 import service_pb2 as pb
from topiary.v1 import service_pb2_grpc

DEFAULT_SERVER = "127.0.0.1:7077"
TERMINAL = frozenset({events_pb2.SUCCEEDED, events_pb2.FAILED, events_pb2.CANCELLED})

SpecLike = Union[str, Mapping, experiment_pb2.ExperimentSpec]


def parse_spec(spec: SpecLike) -> experiment_pb2.ExperimentSpec:
    """An ExperimentSpec from protobuf text format, JSON (a string starting with '{'), a dict
    in the JSON mapping, or the message itself. Raises InvalidArgument (field "spec")."""
    if isinstance(spec, experiment_pb2.ExperimentSpec):
        return spec
    out = experiment_pb2.ExperimentSpec()
    try:
        if isinstance(spec, Mapping):
            json_format.ParseDict(spec, out)
        elif isinstance(spec, str) and spec.lstrip().startswith("{"):
            json_format.Parse(spec, out)
        elif isinstance(spec, str):
            text_format.Parse(spec, out)
        else:
            raise TypeError(f"a spec is text, a dict or an ExperimentSpec, not {type(spec).__name__}")
    except (text_format.ParseError, json_format.ParseError) as e:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"spec: {e}", "spec") from None
    return out


def _state(state: Union[None, str, int]) -> int:
    if state is None:
        return events_pb2.STATE_UNSPECIFIED
    return events_pb2.ExperimentState.Value(state) if isinstance(state, str) else int(state)


class Client:
    """A connection to topiaryd.

    server: "host:port" (default $TOPIARY_SERVER, else 127.0.0.1:7077).
    token_file: a file holding the bearer token (default $TOPIARY_TOKEN_FILE), sent as
      "authorization: Bearer TOKEN" on every call, as the CLI does.
    tls_ca: a PEM CA certificate: connect with TLS trusting it (default: plaintext).
    timeout: seconds for each unary call (streams have none).
    """

    def __init__(self, server: Optional[str] = None, *, token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None, timeout: float = 30.0):
        self.server = server or os.environ.get("TOPIARY_SERVER") or DEFAULT_SERVER
        token_file = token_file or os.environ.get("TOPIARY_TOKEN_FILE") or None
        self._metadata: tuple = ()
        if token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"token_file: {e.strerror}: {token_file}", "token_file") from None
            self._metadata = (("authorization", f"Bearer {token}"),)
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.secure_channel(self.server, creds)
        else:
            self._channel = grpc.insecure_channel(self.server)
        self._stub = service_pb2_grpc.TopiaryStub(self._channel)
        self.timeout = timeout

    # Plumbing.
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout,
                                               metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: grpc.RpcError) -> TopiaryError:
        err = from_rpc_error(e)
        if isinstance(err, Unavailable):
            err.message = f"no topiaryd at {self.server} ({err.message})"
            err.args = (f"{err.code.name}: {err.message}",)
        return err

    # Experiments.
    def submit(self, spec: SpecLike) -> pb.Experiment:
        """Queues an experiment; the returned Experiment has its id and the spec with defaults."""
        return self._call("SubmitExperiment", pb.SubmitExperimentRequest(spec=parse_spec(spec)))

    def get(self, experiment_id: str) -> pb.Experiment:
        return self._call("GetExperiment", pb.ExperimentRef(id=experiment_id))

    def list(self, state: Union[None, str, int] = None) -> List[pb.Experiment]:
        """Experiments, oldest first; only those in `state` ("RUNNING", events_pb2.RUNNING) if given."""
        out, token = [], ""
        while True:  # the daemon answers in pages
            page = self._call("ListExperiments",
                              pb.ListExperimentsRequest(state=_state(state), page_token=token))
            out.extend(page.experiments)
            token = page.next_page_token
            if not token:
                return out

    def pause(self, experiment_id: str) -> pb.Experiment:
        """Checkpoints at the next step and stops (a queued one leaves the queue)."""
        return self._call("PauseExperiment", pb.ExperimentRef(id=experiment_id))

    def resume(self, experiment_id: str) -> pb.Experiment:
        return self._call("ResumeExperiment", pb.ExperimentRef(id=experiment_id))

    def cancel(self, experiment_id: str) -> pb.Experiment:
        return self._call("CancelExperiment", pb.ExperimentRef(id=experiment_id))

    def advance_round(self, experiment_id: str, *, target: Optional[float] = None,
                      step_fraction: Optional[float] = None,
                      finetune_epochs: Optional[int] = None, finish: bool = False,
                      taken_timeout: float = 60.0) -> pb.Experiment:
        """Starts the next manual round (pruning.manual_rounds) of an experiment in
        WAITING_FOR_ROUND, optionally changing the target, step fraction or fine-tuning;
        with finish=True, ends the rounds instead (the run finishes after the round it has
        done, SUCCEEDED, its summary's target_note saying the client ended the rounds).

        The daemon's run takes the request asynchronously; this returns once it has (the
        experiment left WAITING_FOR_ROUND or completed another round), so that a following
        wait(id, ["WAITING_FOR_ROUND"]) waits for the new round rather than seeing the old
        state. Raises TimeoutError if that takes over `taken_timeout` seconds."""
        before = self.get(experiment_id).round
        req = pb.AdvanceRoundRequest(id=experiment_id)
        if target is not None:
            req.target = target
        if step_fraction is not None:
            req.step_fraction = step_fraction
        if finetune_epochs is not None:
            req.finetune_epochs = finetune_epochs
        req.finish = finish
        self._call("AdvanceRound", req)
        end = time.monotonic() + taken_timeout
        while True:
            exp = self.get(experiment_id)
            if exp.state != events_pb2.WAITING_FOR_ROUND or exp.round > before:
                return exp
            if time.monotonic() > end:
                raise TimeoutError(f"{experiment_id}: the round was not taken in {taken_timeout} s")
            time.sleep(0.05)

    def fork(self, checkpoint: str, set: Union[None, Mapping[str, object], Sequence[str]] = None,
             name: str = "") -> pb.Experiment:
        """A new experiment from `checkpoint` (data-directory relative, as checkpoints()
        gives it) with spec changes: {"pruning.target": 0.75} or ["pruning.target=0.75"]."""
        changes: Iterable[str]
        if set is None:
            changes = []
        elif isinstance(set, Mapping):
            changes = [f"{k}={_text_value(k, v)}" for k, v in set.items()]
        else:
            changes = list(set)
        return self._call("ForkExperiment",
                          pb.ForkExperimentRequest(checkpoint=checkpoint, set=changes, name=name))

    def watch(self, experiment_id: str, from_seq: int = 0, *,
              reconnect_seconds: float = 30.0) -> Iterator[events_pb2.Event]:
        """The experiment's events after sequence number `from_seq` (0: from the start), as
        they happen, until it ends (SUCCEEDED, FAILED, CANCELLED). If the daemon goes away
        mid-stream (a restart), reconnects for up to `reconnect_seconds` and continues after
        the last event seen, so nothing is repeated or lost."""
        seq = from_seq
        deadline = None
        while True:
            stream = self._stub.WatchExperiment(
                pb.WatchExperimentRequest(id=experiment_id, from_seq=seq), metadata=self._metadata)
            try:
                for event in stream:
                    deadline = None
                    seq = event.seq
                    yield event
                return
            except grpc.RpcError as e:
                err = self._error(e)
                if not isinstance(err, Unavailable) or reconnect_seconds <= 0:
                    raise err from None
                now = time.monotonic()
                deadline = deadline or now + reconnect_seconds
                if now >= deadline:
                    raise err from None
                time.sleep(0.5)
            finally:
                stream.cancel()

    def wait(self, experiment_id: str, states: Iterable[Union[str, int]] = TERMINAL,
             timeout: Optional[float] = None, poll: float = 0.2) -> pb.Experiment:
        """Polls until the experiment is in one of `states` (default: ended) and returns it;
        e.g. states=["WAITING_FOR_ROUND"] between manual rounds. Raises TimeoutError."""
        wanted = {_state(s) for s in states}
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            exp = self.get(experiment_id)
            if exp.state in wanted:
                return exp
            if exp.state in TERMINAL:
                raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"{experiment_id} ended {events_pb2.ExperimentState.Name(exp.state)}"
                                   f" ({exp.error or 'no error'}) before reaching "
                                   f"{sorted(events_pb2.ExperimentState.Name(s) for s in wanted)}")
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"{experiment_id} is {events_pb2.ExperimentState.Name(exp.state)} "
                                   f"after {timeout} s")
            time.sleep(poll)

    # Checkpoints and the daemon.
    def checkpoints(self, experiment_id: str) -> List[pb.CheckpointInfo]:
        """Its checkpoints, oldest first (paths relative to the daemon's data directory)."""
        return list(self._call("ListCheckpoints", pb.ExperimentRef(id=experiment_id)).checkpoints)

    def inspect(self, path: str, layer: str = "") -> checkpoint_pb2.CheckpointReport:
        """The daemon's report of a checkpoint (data-directory relative); `layer` a glob."""
        return self._call("InspectCheckpoint", pb.InspectCheckpointRequest(path=path, layer=layer))

    def import_model(self, onnx_path: str, out_path: str, *,
                     mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                     max_value: float = 0.0, arch: str = "", height: int = 0, width: int = 0,
                     channels: int = 0, data: str = "") -> network_pb2.ImportSummary:
        """The daemon imports an ONNX model in its data directory into a new checkpoint there
        (`topiary import --remote`); a spec without model.arch can then start from it.
        `data` ("folder:sets/jpegs", "fashion_mnist", ...) is recorded with it, so that
        evaluate() needs no data set."""
        return self._call("ImportModel", pb.ImportModelRequest(
            onnx_path=onnx_path, out_path=out_path, mean=list(mean or []), std=list(std or []),
            max_value=max_value, arch=arch, height=height, width=width, channels=channels,
            data=data))

    def multipliers(self) -> multiplier_pb2.ListMultipliersResponse:
        """The daemon's multiplier tables (with their error metrics) and generated families."""
        return self._call("ListMultipliers", multiplier_pb2.ListMultipliersRequest())

    def info(self) -> pb.ServerInfo:
        """Version, devices, capabilities, queue and each GPU's occupant."""
        return self._call("GetServerInfo", pb.GetServerInfoRequest())

    # Files (topiary.files has the rules).
    def upload(self, local: str, remote: str, progress=None) -> dict:
        """Uploads a file or folder into the data directory at `remote` (checksummed; files
        already there with the same checksum are skipped, so a failed upload is run again).
        progress(files_done, files_total, bytes_done, bytes_total) is called as it goes."""
        from topiary import files
        return files.upload(self, local, remote, progress)

    def download(self, remote: str, local: Optional[str] = None, progress=None) -> dict:
        """Downloads a file or folder of the data directory (a checkpoint, an ONNX export, an
        events.jsonl); a broken download continues from LOCAL.part when called again."""
        from topiary import files
        return files.download(self, remote, local, progress)

    def files(self, path: str = "", sha256: bool = False,
              missing_ok: bool = False) -> List[pb.FileInfo]:
        """The file `path`, or the files under the folder (data-directory relative)."""
        try:
            return list(self._stub.ListFiles(pb.ListFilesRequest(path=path, sha256=sha256),
                                             metadata=self._metadata).files)
        except grpc.RpcError as e:
            if missing_ok and e.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise self._error(e) from None

    def compare(self, experiment_ids: Sequence[str]) -> dict:
        """`topiary compare` for scripts: {"experiments": [{"id", "name", "state", "spec",
        "test_top1", "sparsity", "dense_top1", "rounds": [{"round", "sparsity", "test_top1",
        "multiply_adds", "step_seconds"}]}], "spec_differences": {field: [value per id]}}."""
        out, flat = [], []
        for experiment_id in experiment_ids:
            e = self.get(experiment_id)
            summary, rounds = None, []
            if e.last_seq:
                for event in self.watch(experiment_id):
                    kind = event.WhichOneof("kind")
                    if kind == "round":
                        rounds.append(event.round)
                    elif kind == "summary":
                        summary = event.summary
                    if event.seq >= e.last_seq:
                        break
            if summary is not None and summary.rounds:
                rounds = list(summary.rounds)
            out.append({
                "id": e.id, "name": e.name, "state": events_pb2.ExperimentState.Name(e.state),
                "spec": json_format.MessageToDict(e.spec), "test_top1": e.test_top1,
                "sparsity": e.sparsity, "dense_top1": summary.dense_top1 if summary else 0.0,
                "rounds": [{"round": r.round, "sparsity": r.sparsity, "test_top1": r.test_top1,
                            "multiply_adds": r.multiply_adds, "step_seconds": r.step_seconds}
                           for r in rounds]})
            flat.append(_flatten(out[-1]["spec"]))
        keys = sorted(set().union(*flat)) if flat else []
        diffs = {k: [f.get(k) for f in flat] for k in keys
                 if k != "name" and len({json.dumps(f.get(k)) for f in flat}) > 1}
        return {"experiments": out, "spec_differences": diffs}

    # Commands the daemon runs on files in its data directory (`topiary ... --remote`).
    def run(self, command: str, *args: str) -> "CommandResult":
        """Runs `topiary COMMAND ARGS...` in the daemon (evaluate, sensitivity, export; paths
        data-directory relative) and returns its exit code and output, as printed locally.
        Evaluate and sensitivity wait for a device in the experiments' queue."""
        out, err, code = [], [], None
        for o in self._stream_out("RunCommand", pb.RunCommandRequest(command=command,
                                                                     args=list(args))):
            out.append(o.out)
            err.append(o.err)
            if o.exited:
                code = o.exit_code
        return CommandResult(code if code is not None else 1, b"".join(out).decode(),
                             b"".join(err).decode())

    def _json_command(self, command: str, args: List[str]) -> List[dict]:
        r = self.run(command, *args, "--json")
        rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
        if r.exit_code != 0:
            message = next((row["error"] for row in rows if "error" in row), r.stderr.strip())
            code = _CODE_OF_EXIT.get(r.exit_code, grpc.StatusCode.UNKNOWN)
            raise from_code(code, f"{command}: {message}")
        return rows

    def evaluate(self, checkpoint: str, *, multipliers: Optional[Sequence[str]] = None,
                 weight_code: Union[None, str, Sequence[str]] = None,
                 set: Optional[Sequence[str]] = None, device: Optional[str] = None) -> List[dict]:
        """`topiary evaluate --remote`: the checkpoint's test metrics (one dict), or with
        `multipliers` one row per multiplier and weight code: {"multiplier", "weight_code",
        "top1", "top5", "loss", "power_mw", ...}."""
        args = [checkpoint]
        if multipliers:
            args.append("--multipliers=" + ",".join(multipliers))
        if weight_code:
            codes = [weight_code] if isinstance(weight_code, str) else list(weight_code)
            args.append("--weight_code=" + ",".join(codes))
        for s in set or []:
            args.append("--set=" + s)
        if device:
            args.append("--device=" + device)
        return self._json_command("evaluate", args)

    def sensitivity(self, checkpoint: str, multipliers: Sequence[str], *,
                    budget: Optional[float] = None) -> dict:
        """`topiary sensitivity --remote`: per-layer top-1 under each multiplier and the greedy
        least-power assignment within `budget` points (the JSON object of --json)."""
        args = [checkpoint, *multipliers] + ([f"--budget={budget}"] if budget is not None else [])
        return self._json_command("sensitivity", args)[-1]

    def export_onnx(self, checkpoint: str, onnx_path: str, *, batch: Union[None, int, str] = None,
                    batch_norm: Optional[str] = None) -> dict:
        """`topiary export --remote`: the checkpoint as ONNX at `onnx_path` (a new file in the
        data directory; download() fetches it). Returns the export summary."""
        args = [checkpoint, "--onnx=" + onnx_path]
        if batch is not None:
            args.append(f"--batch={batch}")
        if batch_norm:
            args.append("--batch_norm=" + batch_norm)
        return self._json_command("export", args)[-1]

    def _stream_call(self, method: str, requests):
        """A client-streaming call (no deadline: uploads take as long as they take)."""
        try:
            return getattr(self._stub, method)(requests, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _stream_out(self, method: str, request):
        """The messages of a server-streaming call."""
        try:
            yield from getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._error(e) from None


class CommandResult(NamedTuple):
    """What a command run in the daemon printed, and its exit code (the README's codes)."""
    exit_code: int
    stdout: str
    stderr: str


# topiary's exit codes back to the gRPC codes they stand for.
_CODE_OF_EXIT = {3: grpc.StatusCode.INVALID_ARGUMENT, 4: grpc.StatusCode.NOT_FOUND,
                 5: grpc.StatusCode.FAILED_PRECONDITION, 6: grpc.StatusCode.UNAVAILABLE,
                 7: grpc.StatusCode.PERMISSION_DENIED, 8: grpc.StatusCode.RESOURCE_EXHAUSTED}


def _flatten(d: object, prefix: str = "") -> dict:
    """A spec's JSON mapping as {"pruning.target": 0.5, "approximation.rules[0].layer": ...}."""
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(d, list):
        out = {}
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: d}


def _text_value(path: str, v: object) -> str:
    """v in protobuf text format for the spec field at `path` (strings quoted, enums bare)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if not isinstance(v, str):
        return repr(v)
    descriptor = experiment_pb2.ExperimentSpec.DESCRIPTOR
    field = None
    for part in path.split("."):
        field = descriptor.fields_by_name.get(part) if descriptor else None
        descriptor = field.message_type if field else None
    if field is not None and field.type == field.TYPE_STRING:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return v
