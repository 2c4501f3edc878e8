"""PyTorch definitions of Topiary's model zoo, and checkpoints mapped onto them.

    import topiary
    ckpt = topiary.load_checkpoint("round-003.h5")
    model = topiary.to_torch_model(ckpt)            # eval mode, weights and masks loaded
    logits = model(torch.from_numpy(ckpt.input.normalize(images)))

Each module's parameter names are the checkpoint's layer names (`stage1.block0.conv1.weight`
is layer stage1.block0.conv1's kernel), so a state dict needs no renaming. The definitions
follow trainer/nn/model_zoo.cc exactly: widths max(1, round(c * width)), CIFAR ResNets with
a 3x3 stem, ImageNet ResNets v1.5 (the stride on the bottleneck's 3x3), shortcuts as 1x1
conv + batch norm where the shape changes, batch norm eps 1e-5. Topiary's LeNet-5 flattens
its 16x5x5 features in HWC order; this one flattens NCHW like any PyTorch model, and
to_torch_state_dict reorders fc1's columns to match.

torch is imported here only: the rest of the package works without it.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from topiary.checkpoint import Checkpoint

_ROLES = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias",
          "running_mean": "running_mean", "running_var": "running_var"}


def _channels(c: int, width: float) -> int:
    return max(1, int(math.floor(c * width + 0.5)))  # C's lround for positive values


def _conv(cin, cout, k, stride=1, pad=0, bias=False):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=bias)


class _Shortcut(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = _conv(cin, cout, 1, stride)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = _conv(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = _Shortcut(cin, cout, stride) if stride != 1 or cin != cout else None
        self.out_channels = cout

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.conv1 = _conv(cin, mid, 1)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = _conv(mid, mid, 3, stride, 1)  # ResNet v1.5
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = _conv(mid, cout, 1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = _Shortcut(cin, cout, stride) if stride != 1 or cin != cout else None
        self.out_channels = cout

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class _Stem(nn.Module):
    def __init__(self, cin, cout, k, stride, pad, pool):
        super().__init__()
        self.conv = _conv(cin, cout, k, stride, pad)
        self.bn = nn.BatchNorm2d(cout)
        self.pool = nn.MaxPool2d(3, 2, 1) if pool else None

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.pool(x) if self.pool is not None else x


class _Stage(nn.Module):
    """Blocks named block0, block1, ... (as in `stage2.block0.conv1`)."""

    def __init__(self, blocks):
        super().__init__()
        for i, b in enumerate(blocks):
            self.add_module(f"block{i}", b)

    def forward(self, x):
        for b in self.children():
            x = b(x)
        return x


class ResNet(nn.Module):
    """CIFAR-style (resnet20..110: 3x3 stem, stages of 16/32/64) or ImageNet-style
    (resnet18/34/50: 7x7 stride-2 stem and max pool, stages of 64..512)."""

    def __init__(self, in_channels, classes, blocks, width=1.0, cifar=True, bottleneck=False):
        super().__init__()
        if cifar:
            self.stem = _Stem(in_channels, _channels(16, width), 3, 1, 1, pool=False)
            widths = [16, 32, 64]
        else:
            self.stem = _Stem(in_channels, _channels(64, width), 7, 2, 3, pool=True)
            widths = [64, 128, 256, 512]
        c = self.stem.conv.out_channels
        for s, (n, w) in enumerate(zip(blocks, widths)):
            stage = []
            for k in range(n):
                stride = 2 if s > 0 and k == 0 else 1
                block = (Bottleneck(c, _channels(w, width), stride) if bottleneck
                         else BasicBlock(c, _channels(w, width), stride))
                c = block.out_channels
                stage.append(block)
            self.add_module(f"stage{s + 1}", _Stage(stage))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)
        self.stages = len(blocks)

    def forward(self, x):
        x = self.stem(x)
        for s in range(self.stages):
            x = getattr(self, f"stage{s + 1}")(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class LeNet5(nn.Module):
    """conv(5x5, pad 2) relu maxpool, conv(5x5) relu maxpool, fc relu, fc relu, fc; every
    layer with a bias."""

    def __init__(self, in_channels, classes, input_hw=(28, 28), width=1.0):
        super().__init__()
        c1, c2 = _channels(6, width), _channels(16, width)
        self.conv1 = _conv(in_channels, c1, 5, 1, 2, bias=True)
        self.conv2 = _conv(c1, c2, 5, bias=True)
        h = ((input_hw[0] // 2) - 4) // 2
        w = ((input_hw[1] // 2) - 4) // 2
        self.feature_hwc = (h, w, c2)
        self.fc1 = nn.Linear(c2 * h * w, _channels(120, width))
        self.fc2 = nn.Linear(_channels(120, width), _channels(84, width))
        self.fc = nn.Linear(_channels(84, width), classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


_CIFAR = {"resnet20": 3, "resnet32": 5, "resnet44": 7, "resnet56": 9, "resnet110": 18}
_IMAGENET = {"resnet18": ([2, 2, 2, 2], False), "resnet34": ([3, 4, 6, 3], False),
             "resnet50": ([3, 4, 6, 3], True)}
MODELS = ["lenet5"] + list(_CIFAR) + list(_IMAGENET)


def build_model(arch: str, in_channels: int, classes: int, width: float = 1.0,
                input_hw: Tuple[int, int] = (28, 28)) -> nn.Module:
    """The PyTorch twin of Topiary's `arch` (one of MODELS)."""
    if arch == "lenet5":
        return LeNet5(in_channels, classes, input_hw, width)
    if arch in _CIFAR:
        return ResNet(in_channels, classes, [_CIFAR[arch]] * 3, width, cifar=True)
    if arch in _IMAGENET:
        blocks, bottleneck = _IMAGENET[arch]
        return ResNet(in_channels, classes, blocks, width, cifar=False, bottleneck=bottleneck)
    raise ValueError(f"model.arch: unknown architecture {arch!r}; one of {', '.join(MODELS)} "
                     "(a network from elsewhere, e.g. `topiary import`, goes back through "
                     "`topiary export --onnx`)")


def _hwc_to_chw_columns(w: np.ndarray, h: int, wd: int, c: int) -> np.ndarray:
    """fc1's [out, H*W*C] columns (Topiary's NHWC flatten) reordered to C*H*W."""
    return np.ascontiguousarray(w.reshape(w.shape[0], h, wd, c).transpose(0, 3, 1, 2)
                                .reshape(w.shape[0], -1))


def to_torch_state_dict(ckpt: Checkpoint, arch: Union[str, nn.Module, None] = None
                        ) -> "OrderedDict[str, torch.Tensor]":
    """The checkpoint's parameters as a state dict of the zoo's PyTorch twin (arch: a model
    name, default the checkpoint's, or a module to check the result against). Masked
    weights are exact zeros. Raises ValueError naming a missing or misshapen parameter."""
    module = arch if isinstance(arch, nn.Module) else None
    name = ckpt.arch if module is not None or arch is None else arch
    if name != ckpt.arch:
        raise ValueError(f"arch: the checkpoint is a {ckpt.arch}, not a {name}")
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for layer in ckpt.layers.values():
        for role, torch_name in _ROLES.items():
            value = getattr(layer, role)
            if value is None:
                continue
            if role == "kernel" and layer.name == "fc1" and ckpt.arch == "lenet5":
                c = ckpt.layers["conv2"].kernel.shape[0]
                h, w = _lenet_feature_hw(ckpt, value.shape[1] // c)
                value = _hwc_to_chw_columns(value, h, w, c)
            out[f"{layer.name}.{torch_name}"] = torch.from_numpy(np.array(value, np.float32))
        if layer.running_mean is not None:
            out[f"{layer.name}.num_batches_tracked"] = torch.tensor(ckpt.global_step)
    if module is not None:
        want = module.state_dict()
        missing = [k for k in want if k not in out]
        extra = [k for k in out if k not in want]
        if missing or extra:
            raise ValueError(f"{ckpt.path}: does not fit the module: missing {missing[:5]}, "
                             f"unexpected {extra[:5]}")
        for k, v in want.items():
            if tuple(v.shape) != tuple(out[k].shape):
                raise ValueError(f"{ckpt.path}: {k}: shape {tuple(out[k].shape)}, the module "
                                 f"has {tuple(v.shape)}")
    return out


def _lenet_feature_hw(ckpt: Checkpoint, pixels: int) -> Tuple[int, int]:
    if ckpt.input is not None:
        h = ((ckpt.input.height // 2) - 4) // 2
        w = ((ckpt.input.width // 2) - 4) // 2
    else:
        h = w = int(round(math.sqrt(pixels)))
    if h * w != pixels:
        raise ValueError(f"{ckpt.path}: fc1 reads {pixels} pixels per channel, not {h}x{w}")
    return h, w


def _compacted(ckpt: Checkpoint) -> bool:
    """Whether channel pruning narrowed the checkpoint's network (its graph says so)."""
    layers = (ckpt.network or {}).get("layers", [])
    return any(layer.get("original_out_channels", 0) for layer in layers)


def _narrow_to(model: nn.Module, ckpt: Checkpoint) -> None:
    """Each conv, linear and batch-norm module of the zoo twin made as narrow as the
    checkpoint's layer of the same name (channel pruning removed channels, not layers: the
    twin's forward pass stays the network's)."""
    for name, module in list(model.named_modules()):
        layer = ckpt.layers.get(name)
        if layer is None:
            continue
        if isinstance(module, nn.Conv2d):
            out, cin = layer.kernel.shape[:2]
            new = nn.Conv2d(cin, out, module.kernel_size, stride=module.stride,
                            padding=module.padding, bias=module.bias is not None)
        elif isinstance(module, nn.Linear):
            out, cin = layer.kernel.shape
            new = nn.Linear(cin, out, bias=module.bias is not None)
        elif isinstance(module, nn.BatchNorm2d):
            new = nn.BatchNorm2d(layer.gamma.shape[0], eps=module.eps)
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)


def to_torch_model(ckpt: Checkpoint, device: Union[str, torch.device] = "cpu") -> nn.Module:
    """The checkpoint's network in PyTorch with its weights loaded, in eval mode: the zoo's
    twin (as narrow as the checkpoint where channel pruning narrowed it), or for a network
    from elsewhere (`topiary import`) a GraphNet of its recorded graph. Either reads images
    normalized as the checkpoint's input format says."""
    if ckpt.arch not in MODELS and (ckpt.network or {}).get("layers"):
        model = GraphNet(ckpt)
        to_torch(ckpt, model, model.name_map())
        return model.to(device).eval()
    if ckpt.input is not None:
        cin, classes, hw = ckpt.input.channels, ckpt.input.classes, (ckpt.input.height,
                                                                      ckpt.input.width)
    else:  # older checkpoints: channels from the first kernel, classes from fc
        first = ckpt.layers[next(n for n in ckpt.layer_order if n in ckpt.layers)].kernel
        cin, classes = first.shape[1], ckpt.layers["fc"].kernel.shape[0]
        hw = (28, 28)
    model = build_model(ckpt.arch, cin, classes, ckpt.width, hw)
    if _compacted(ckpt):
        _narrow_to(model, ckpt)
    model.load_state_dict(to_torch_state_dict(ckpt, model))
    return model.to(device).eval()



# %% Networks from elsewhere: a module of the checkpoint's graph.
def _hard_sigmoid(x, n):
    return torch.clamp(n.get("alpha", 0.0) * x + n.get("beta", 0.0), 0.0, 1.0)


_ACTIVATIONS = {
    "sigmoid": lambda x, n: torch.sigmoid(x),
    "silu": lambda x, n: x * torch.sigmoid(x),
    "leaky_relu": lambda x, n: torch.nn.functional.leaky_relu(x, n.get("alpha", 0.0)),
    "hard_sigmoid": _hard_sigmoid,
    "hard_swish": lambda x, n: torch.nn.functional.hardswish(x),
}



class GraphNet(nn.Module):
    """A checkpoint's network graph (an imported model's) as a PyTorch module: its layers in
    order, each reading the outputs of earlier ones by name, NCHW as PyTorch computes. Shapes
    come from the checkpoint's weights; to_torch_model loads them."""

    def __init__(self, ckpt: Checkpoint):
        super().__init__()
        self.nodes = list(ckpt.network["layers"])
        self.layers = nn.ModuleDict()
        for n in self.nodes:
            kind, params = n["kind"], ckpt.layers.get(n["name"])
            if kind in ("conv2d", "grouped_conv2d"):
                out, cin_g, kh, kw = params.kernel.shape
                groups = n.get("groups") or 1 if kind == "grouped_conv2d" else 1
                module = nn.Conv2d(cin_g * groups, out, (kh, kw), stride=n.get("stride") or 1,
                                   padding=n.get("pad", 0), groups=groups,
                                   bias=params.bias is not None)
            elif kind == "batch_norm":
                module = nn.BatchNorm2d(params.gamma.shape[0], eps=n.get("epsilon") or 1e-5)
            elif kind == "linear":
                module = nn.Linear(params.kernel.shape[1], params.kernel.shape[0],
                                   bias=params.bias is not None)
            elif kind in ("relu", "relu6", "add", "concat", "flatten", "max_pool", "avg_pool",
                          "global_avg_pool") or kind in _ACTIVATIONS or kind == "mul":
                continue
            else:
                raise ValueError(f"{ckpt.path}: layer {n['name']}: kind {kind!r} has no PyTorch "
                                 "form here")
            self.layers[self._key(n["name"])] = module

    @staticmethod
    def _key(name: str) -> str:
        return name.replace(".", "_")  # ModuleDict keys hold no dots

    def name_map(self) -> Dict[str, str]:
        """{checkpoint layer: module name} for to_torch."""
        return {n["name"]: "layers." + self._key(n["name"]) for n in self.nodes
                if self._key(n["name"]) in self.layers}

    def forward(self, x):
        import torch.nn.functional as F
        values = {"input": x}
        for n in self.nodes:
            kind, ins = n["kind"], [values[i] for i in n["inputs"]]
            key = self._key(n["name"])
            if kind == "linear" and ins[0].dim() > 2:
                ins[0] = torch.flatten(ins[0], 1)
            if key in self.layers:
                y = self.layers[key](ins[0])
            elif kind == "relu":
                y = F.relu(ins[0])
            elif kind == "relu6":
                y = F.relu6(ins[0])
            elif kind in _ACTIVATIONS:
                y = _ACTIVATIONS[kind](ins[0], n)
            elif kind == "mul":
                a, b = ins
                if a.dim() != b.dim():  # a linear layer's [N, C] scale of an [N, C, H, W] map
                    a, b = (a[:, :, None, None], b) if a.dim() == 2 else (a, b[:, :, None, None])
                y = a * b
            elif kind == "add":
                y = ins[0]
                for other in ins[1:]:
                    y = y + other
            elif kind == "concat":
                y = torch.cat(ins, 1)
            elif kind == "flatten":
                y = torch.flatten(ins[0], 1)
            elif kind == "max_pool":
                y = F.max_pool2d(ins[0], n["window"], n.get("stride") or n["window"],
                                 n.get("pad", 0))
            elif kind == "avg_pool":
                y = F.avg_pool2d(ins[0], n["window"], n.get("stride") or n["window"],
                                 n.get("pad", 0), count_include_pad=True)
            else:  # global_avg_pool
                y = ins[0].mean((2, 3), keepdim=True)
            if n.get("relu"):
                y = F.relu(y)
            values[n["name"]] = y
        return values[self.nodes[-1]["name"]]


# %% Weights back into the user's own module.
_KINDS = {"conv2d": nn.Conv2d, "grouped_conv2d": nn.Conv2d, "linear": nn.Linear,
          "batch_norm": nn.BatchNorm2d}


def _graph_layers(ckpt: Checkpoint) -> Dict[str, dict]:
    return {layer["name"]: layer for layer in (ckpt.network or {}).get("layers", [])}


def _kind_of(ckpt: Checkpoint, name: str) -> Optional[type]:
    layer = _graph_layers(ckpt).get(name)
    if layer is not None:
        return _KINDS.get(layer["kind"])
    params = ckpt.layers[name]  # a zoo checkpoint: from its parameters
    if params.gamma is not None:
        return nn.BatchNorm2d
    if params.kernel is not None:
        return nn.Conv2d if params.kernel.ndim == 4 else nn.Linear
    return None


def _flatten_source_channels(ckpt: Checkpoint, name: str) -> int:
    """For a linear layer of a graph, the channels of the map a flatten before it reads (0
    when no flatten of a map feeds it)."""
    graph = _graph_layers(ckpt)
    node, flattened = graph.get(name), False
    while node is not None and node["inputs"]:
        node = graph.get(node["inputs"][0])
        if node is None:
            return 0
        if node["kind"] == "flatten":
            flattened = True
        elif node["kind"] in ("global_avg_pool", "linear"):
            return 0  # a 1x1 map, or no map at all: nothing to reorder
        elif flattened and node.get("out_channels", 0) > 0:
            return node["out_channels"]
        elif flattened and node["name"] in ckpt.layers and \
                ckpt.layers[node["name"]].gamma is not None:
            return ckpt.layers[node["name"]].gamma.shape[0]
    return 0


def to_torch(ckpt: Union[Checkpoint, str, os.PathLike], module: nn.Module,
             name_map: Optional[Dict[str, str]] = None, masks: str = "zero") -> Dict[str, str]:
    """Writes a checkpoint's weights into the user's own `module` (in place) and returns the
    mapping used, {checkpoint layer: module name}.

    Each conv, linear and batch-norm layer of the checkpoint goes to the module of that type
    named by `name_map`, else of the same name, else the next one of that type in the
    module's registration order (a network imported from this module lists its layers in
    forward order); every shape is checked and a mismatch raises ValueError naming both.
    - Batch norm the checkpoint folded into its convolutions (a model exported in eval mode)
      is unfolded: the module's BatchNorm2d after each conv becomes the identity carrying the
      folded bias. A batch norm the checkpoint keeps but the module lacks is refused by name.
    - A linear layer reading a flattened H x W map gets its columns reordered from
      Topiary's (h, w, c) to PyTorch's (c, h, w).
    - masks: "zero" writes pruned weights as exact zeros; "prune" also attaches them with
      torch.nn.utils.prune.custom_from_mask, so fine-tuning in PyTorch keeps them zero.
    """
    from topiary.checkpoint import load_checkpoint
    if isinstance(ckpt, (str, os.PathLike)):
        ckpt = load_checkpoint(os.fspath(ckpt))
    if masks not in ("zero", "prune"):
        raise ValueError(f"masks: 'zero' or 'prune', not {masks!r}")
    name_map = dict(name_map or {})
    modules = {n: m for n, m in module.named_modules() if type(m) in (nn.Conv2d, nn.Linear,
                                                                     nn.BatchNorm2d)}
    order = list(modules)
    layers = [n for n in ckpt.layer_order if n in ckpt.layers and _kind_of(ckpt, n)]
    ckpt_has_bn = any(_kind_of(ckpt, n) is nn.BatchNorm2d for n in layers)
    taken, mapping = set(), {}
    for name in layers:
        kind = _kind_of(ckpt, name)
        target = name_map.get(name) or (name if name in modules else None)
        if target is None:
            target = next((m for m in order if m not in taken and type(modules[m]) is kind), None)
        if target is None or target not in modules:
            raise ValueError(f"{ckpt.path}: layer {name} ({kind.__name__}): no module for it"
                             + (f" (name_map names {target!r})" if target else
                                " (every one of that type is taken); pass name_map"))
        if type(modules[target]) is not kind:
            raise ValueError(f"{ckpt.path}: layer {name} is a {kind.__name__}; module {target} "
                             f"is a {type(modules[target]).__name__}")
        taken.add(target)
        mapping[name] = target
    left_bn = [m for m in order if m not in taken and isinstance(modules[m], nn.BatchNorm2d)]
    if ckpt_has_bn and left_bn:
        raise ValueError(f"{ckpt.path}: the module's batch norms {left_bn[:3]} have no layer "
                         "in the checkpoint")

    def put(param: torch.nn.Parameter, value: np.ndarray, what: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(f"{ckpt.path}: {what}: the checkpoint has shape "
                             f"{tuple(value.shape)}, the module {tuple(param.shape)}")
        param.copy_(torch.from_numpy(np.ascontiguousarray(value, np.float32)))

    # A conv whose folded bias the module cannot hold (bias=False) hands it to its batch norm.
    pending_bias: Dict[str, np.ndarray] = {}
    with torch.no_grad():
        for name, target in mapping.items():
            layer, m = ckpt.layers[name], modules[target]
            if isinstance(m, nn.BatchNorm2d):
                put(m.weight, layer.gamma, f"{name} -> {target}.weight")
                put(m.bias, layer.beta, f"{name} -> {target}.bias")
                put(m.running_mean, layer.running_mean, f"{name} -> {target}.running_mean")
                put(m.running_var, layer.running_var, f"{name} -> {target}.running_var")
                continue
            kernel = np.array(layer.kernel, np.float32)
            keep = layer.keep()
            if keep is not None:
                kernel = np.where(keep, kernel, np.float32(0))
            if isinstance(m, nn.Linear):
                c = _flatten_source_channels(ckpt, name)
                if c and kernel.shape[1] // c > 1:
                    hw = kernel.shape[1] // c
                    side = int(round(math.sqrt(hw)))
                    if side * side != hw:
                        raise ValueError(f"{ckpt.path}: {name} reads a {hw}-pixel map that is "
                                         "not square; reorder its columns by hand")
                    kernel = _hwc_to_chw_columns(kernel, side, side, c)
                    keep = None if keep is None else _hwc_to_chw_columns(
                        keep.astype(np.float32), side, side, c) > 0
            put(m.weight, kernel, f"{name} -> {target}.weight")
            if layer.bias is not None and m.bias is not None:
                put(m.bias, layer.bias, f"{name} -> {target}.bias")
            elif layer.bias is not None:
                pending_bias[target] = np.array(layer.bias, np.float32)
            elif m.bias is not None:
                m.bias.zero_()
            if masks == "prune" and keep is not None:
                import torch.nn.utils.prune as prune
                prune.custom_from_mask(m, "weight", torch.from_numpy(np.ascontiguousarray(keep)))
        # Folded batch norm: each left-over BatchNorm2d after a conv is the identity, plus
        # the bias its conv could not hold.
        if not ckpt_has_bn:
            previous = None
            for n in order:
                m = modules[n]
                if isinstance(m, nn.Conv2d):
                    previous = n
                    continue
                if not isinstance(m, nn.BatchNorm2d) or n in taken:
                    continue
                if previous is None or modules[previous].out_channels != m.num_features:
                    raise ValueError(f"{ckpt.path}: batch norm {n} follows no conv of "
                                     f"{m.num_features} channels; it cannot be unfolded")
                m.weight.fill_(1)
                m.running_mean.zero_()
                m.running_var.fill_(1 - m.eps)
                m.bias.copy_(torch.from_numpy(pending_bias.pop(previous, np.zeros(
                    m.num_features, np.float32))))
                mapping.setdefault(f"(unfolded into {previous})", n)
        if pending_bias:
            raise ValueError(f"{ckpt.path}: convs {sorted(pending_bias)[:3]} have a bias in the "
                             "checkpoint but none in the module, and no batch norm follows them")
    return mapping
