"""A small numpy interpreter of the ONNX operators `topiary export` writes, so that CI (which
has onnx's checker but no runtime) can run an exported model on real images. float64
throughout: a reference, not a fast path."""
import numpy as np
from onnx import numpy_helper


def _attrs(node):
    out = {}
    for a in node.attribute:
        out[a.name] = list(a.ints) if a.ints else (a.i if a.type == a.INT else a.f)
    return out


def _windows(x, kh, kw, stride, pads, value):
    """[N, C, Ho, Wo, kh, kw] views of x padded with `value`."""
    t, l, b, r = pads[0], pads[1], pads[2], pads[3]
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)
    v = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return v[:, :, ::stride[0], ::stride[1]]


def _conv(x, w, b, a):
    k = w.shape[2:]
    win = _windows(x, k[0], k[1], a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), 0.0)
    y = np.einsum("nchwij,kcij->nkhw", win, w, optimize=True)
    return y if b is None else y + b[None, :, None, None]


def run(model, x, batch=250):
    """The graph's single output for input x (the graph's single input), `batch` images at a
    time (the window views of a convolution are large in float64)."""
    return np.concatenate([_run(model, x[i:i + batch]) for i in range(0, len(x), batch)])


def _run(model, x):
    values = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    values[model.graph.input[0].name] = x.astype(np.float64)
    for node in model.graph.node:
        ins = [values[i] if i else None for i in node.input]
        a = _attrs(node)
        op = node.op_type
        if op == "Mul":
            y = ins[0] * ins[1]
        elif op == "Sub":
            y = ins[0] - ins[1]
        elif op == "Add":
            y = ins[0] + ins[1]
        elif op == "Relu":
            y = np.maximum(ins[0], 0)
        elif op == "Conv":
            y = _conv(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)
        elif op == "BatchNormalization":
            xx, g, bb, m, v = ins
            s = (g / np.sqrt(v + a.get("epsilon", 1e-5)))[None, :, None, None]
            y = (xx - m[None, :, None, None]) * s + bb[None, :, None, None]
        elif op in ("MaxPool", "AveragePool"):
            k = a["kernel_shape"]
            pads = a.get("pads", [0, 0, 0, 0])
            win = _windows(ins[0], k[0], k[1], a.get("strides", [1, 1]), pads,
                           -np.inf if op == "MaxPool" else 0.0)
            y = win.max(axis=(4, 5)) if op == "MaxPool" else win.mean(axis=(4, 5))
        elif op == "GlobalAveragePool":
            y = ins[0].mean(axis=(2, 3), keepdims=True)
        elif op == "Flatten":
            y = ins[0].reshape(ins[0].shape[0], -1)
        elif op == "Gemm":
            w = ins[1].T if a.get("transB", 0) else ins[1]
            y = ins[0] @ w + (ins[2] if len(ins) > 2 else 0)
        else:
            raise NotImplementedError(op)
        values[node.output[0]] = y
    return values[model.graph.output[0].name]
