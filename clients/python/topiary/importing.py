"""PyTorch models into Topiary: topiary.from_torch exports a module to ONNX and imports it with
`topiary import` (the CLI), so the network becomes a checkpoint any experiment can start from
(a spec without model.arch, init_from_checkpoint naming the file). The reverse is
topiary.to_torch_model for zoo checkpoints and `topiary export --onnx` for any checkpoint."""
import json
import os
import shutil
import subprocess
import tempfile
import warnings
from typing import Optional, Sequence

import grpc

from topiary.errors import InvalidArgument, NotFound


def _topiary_binary(topiary_bin: Optional[str]) -> str:
    path = topiary_bin or os.environ.get("TOPIARY") or shutil.which("topiary")
    if not path or not os.path.exists(path):
        raise NotFound(grpc.StatusCode.NOT_FOUND,
                       "the topiary CLI was not found: pass topiary_bin=, set $TOPIARY or put "
                       "topiary on PATH")
    return path


def import_onnx(onnx_path: str, path: str, mean: Optional[Sequence[float]] = None,
                std: Optional[Sequence[float]] = None, max_value: float = 255.0,
                arch: Optional[str] = None, topiary_bin: Optional[str] = None) -> dict:
    """`topiary import ONNX_PATH --out PATH`; returns its summary (layers, parameters, input,
    classes). mean and std: the per-channel normalization the model was trained with, on
    pixels / max_value (recorded in the checkpoint; runs from it use it)."""
    args = [_topiary_binary(topiary_bin), "import", onnx_path, "--out", path, "--json",
            "--max_value", repr(float(max_value))]
    if mean is not None:
        args += ["--mean", ",".join(repr(float(m)) for m in mean)]
    if std is not None:
        args += ["--std", ",".join(repr(float(s)) for s in std)]
    if arch:
        args += ["--arch", arch]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        message = r.stderr.strip() or r.stdout.strip()
        try:
            message = json.loads(r.stdout)["error"]
        except (ValueError, KeyError):
            pass
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message)
    return json.loads(r.stdout.strip().splitlines()[-1])


def from_torch(module, example_input, path: str, mean: Optional[Sequence[float]] = None,
               std: Optional[Sequence[float]] = None, max_value: float = 255.0,
               arch: Optional[str] = None, topiary_bin: Optional[str] = None,
               fold_batch_norm: bool = False) -> dict:
    """Writes `module` (a CNN of the operators `topiary import` reads) as the Topiary
    checkpoint `path`. example_input: one batch [N, C, H, W] as the module reads it
    (normalized). The module is exported at opset 13 in eval mode, its batch norms kept as
    layers (trainable, and their running statistics updated by fine-tuning) and its layers
    named as its modules are ("stem.0", "layer1.0.conv1"), so to_torch finds them by name.
    fold_batch_norm=True lets PyTorch fold each batch norm after a convolution into it
    instead (fewer layers; the folded layers are named by ONNX). Returns import_onnx's
    summary."""
    import torch  # only here: the package does not need torch otherwise

    was_training = module.training
    module.eval()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = os.path.join(tmp, (arch or "model").replace(":", "_") + ".onnx")
            with torch.no_grad(), warnings.catch_warnings():
                # Its advice against constant folding is for modules in training mode.
                warnings.filterwarnings("ignore", message=".*constant folding.*")
                # PRESERVE on a module in eval mode: inference-mode batch norm, left unfolded
                # (EVAL folds it into the convolution and renames the weights).
                mode = (torch.onnx.TrainingMode.EVAL if fold_batch_norm
                        else torch.onnx.TrainingMode.PRESERVE)
                torch.onnx.export(module, example_input, onnx_path, opset_version=13,
                                  input_names=["input"], output_names=["logits"],
                                  training=mode)
            return import_onnx(onnx_path, path, mean=mean, std=std, max_value=max_value,
                               arch=arch or "torch:" + type(module).__name__,
                               topiary_bin=topiary_bin)
    finally:
        module.train(was_training)
