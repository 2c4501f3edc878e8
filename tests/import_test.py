"""ONNX import against PyTorch (Debian's python3-torch): networks built in PyTorch, exported to
ONNX, imported with `topiary import`; Topiary's CPU logits (tests/tools/onnx_logits) must equal
PyTorch's within 1e-4 relative. Then hostile files: each a clear error, never a crash.

usage: import_test.py TOPIARY ONNX_LOGITS WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python", "tests"))
from torch_blocks import InvertedResidual  # noqa: E402

TOPIARY, LOGITS, WORK = sys.argv[1:4]
failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""))
    if not ok:
        failures.append(name)


class Basic(nn.Module):  # torchvision's BasicBlock
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.down is None else self.down(x)))


def resnet18(classes=10, w=16):  # torchvision's layout, narrower
    layers = [nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = w
    for i, cout in enumerate([w, 2 * w, 4 * w, 8 * w]):
        layers += [Basic(cin, cout, 1 if i == 0 else 2), Basic(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def vgg_bn(classes=10):  # VGG with batch norm; the classifier reads a 2x2 map
    cfg, layers, cin = [16, "M", "B", 32, "M", 64, 64, "M"], [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        elif v == "B":  # a batch norm no convolution precedes: exported as BatchNormalization
            layers.append(nn.BatchNorm2d(cin))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            cin = v
    layers += [nn.Flatten(), nn.Linear(64 * 4 * 4, 48), nn.ReLU(inplace=True), nn.Dropout(),
               nn.Linear(48, classes)]
    return nn.Sequential(*layers)


def mobilenet_v2(classes=10):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True),
        InvertedResidual(16, 16, 1, 1), InvertedResidual(16, 24, 2, 6),
        InvertedResidual(24, 24, 1, 6), InvertedResidual(24, 32, 2, 6),
        nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, classes))


class Grouped(nn.Module):  # ResNeXt-style grouped 3x3, an Inception-style concat, x.mean
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU())
        self.a = nn.Conv2d(16, 16, 3, 1, 1, groups=4)
        self.b = nn.Sequential(nn.Conv2d(16, 8, 1), nn.ReLU())
        self.pool = nn.AvgPool2d(2, 2)
        self.fc = nn.Linear(24, classes)

    def forward(self, x):
        x = self.stem(x)
        y = torch.cat([self.a(x), self.b(x)], 1)
        return self.fc(self.pool(y).mean(dim=(2, 3)))  # ReduceMean over H, W


def randomize_bn(model, gen):
    # Non-trivial statistics, so batch norm is really checked.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def import_and_compare(name, model, hw, fold):
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        randomize_bn(model, gen)
    model.eval()
    x = torch.randn(5, 3, hw, hw, generator=gen)
    onnx_path = os.path.join(WORK, name + ".onnx")
    torch.onnx.export(model, x[:1], onnx_path, opset_version=13, do_constant_folding=fold,
                      input_names=["image"], output_names=["logits"])
    ckpt = os.path.join(WORK, name + ".h5")
    r = run([TOPIARY, "import", onnx_path, "--out", ckpt, "--json"])
    check(name + " imports", r.returncode == 0, r.stdout.strip() + r.stderr.strip())
    if r.returncode != 0:
        return
    inp, out = os.path.join(WORK, name + ".in"), os.path.join(WORK, name + ".out")
    x.numpy().astype(np.float32).tofile(inp)
    r = run([LOGITS, ckpt, inp, "5", out])
    check(name + " runs", r.returncode == 0, r.stderr.strip())
    if r.returncode != 0:
        return
    with torch.no_grad():
        ref = model(x).double().numpy()
    got = np.fromfile(out, dtype=np.float32).reshape(ref.shape)
    rel = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12)
    check(name + " logits equal PyTorch's", rel <= 1e-4, "max relative difference %.2e" % rel)


torch.manual_seed(0)
import_and_compare("resnet18_bn_kept", resnet18(), 64, fold=False)
import_and_compare("resnet18_bn_folded", resnet18(), 64, fold=True)
import_and_compare("vgg_bn", vgg_bn(), 32, fold=False)
import_and_compare("mobilenet_v2", mobilenet_v2(), 32, fold=False)
import_and_compare("grouped_concat", Grouped(), 16, fold=True)


# Hostile files: each refused with a message naming the problem, exit code 3 (bad input; not a
# crash), and no checkpoint written.
def hostile(name, model_bytes, expect):
    path = os.path.join(WORK, name + ".onnx")
    with open(path, "wb") as f:
        f.write(model_bytes)
    r = run([TOPIARY, "import", path, "--out", os.path.join(WORK, name + ".h5")])
    ok = r.returncode == 3 and expect in r.stderr and not os.path.exists(os.path.join(WORK, name + ".h5"))
    check("hostile " + name, ok, "exit %d: %s" % (r.returncode, r.stderr.strip()[:300]))


def graph(nodes, inits, out_dims=(1, 10), in_dims=(1, 3, 8, 8)):
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_dims))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


w = helper.make_tensor("w", TensorProto.FLOAT, [10, 3 * 8 * 8], np.zeros(10 * 192, np.float32))
flat = helper.make_node("Flatten", ["x"], ["f"], name="flat")
gemm = helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)
good = graph([flat, gemm], [w])
hostile("unsupported_op", graph([flat, helper.make_node("Gemm", ["f", "w"], ["z"], transB=1, name="fc"),
                                 helper.make_node("Softmax", ["z"], ["y"], name="soft")], [w]),
        "node 'soft' (Softmax): operator not supported")
hostile("cycle", graph([helper.make_node("Relu", ["r2"], ["r1"], name="r1"),
                        helper.make_node("Relu", ["r1"], ["r2"], name="r2"),
                        flat, gemm], [w]), "node 'r1' (Relu): reads 'r2', which no earlier node makes")
hostile("truncated", good[: len(good) // 2], "not an ONNX model")
hostile("not_onnx", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "not an ONNX model")
huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20])
hostile("absurd_dims", graph([flat, gemm], [huge]), "are negative or over")
short = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10, 192],
                    raw_data=np.zeros(5, np.float32).tobytes())
hostile("short_tensor", graph([flat, gemm], [short]), "different number of values")
ext = onnx.load_from_string(good)
ext.graph.initializer[0].data_location = TensorProto.EXTERNAL
ext.graph.initializer[0].ClearField("raw_data")
ext.graph.initializer[0].ClearField("float_data")
ext.graph.initializer[0].external_data.add(key="location", value="../../etc/passwd")
hostile("external_data", ext.SerializeToString(), "external file")
conv = helper.make_tensor("k", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
hostile("dilated_conv", graph([helper.make_node("Conv", ["x", "k"], ["c"], name="dil", dilations=[2, 2],
                                                kernel_shape=[3, 3]), flat, gemm], [w, conv]),
        "dilations other than 1")
wide = helper.make_tensor("w", TensorProto.FLOAT, [10, 7], np.zeros(70, np.float32))
hostile("wrong_weight_shape", graph([flat, gemm], [wide]), "the network needs")
hostile("symbolic_input", graph([flat, gemm], [w], in_dims=("N", 3, "H", 8)), "give it (--input HxWxC)")

# Third hostile pass. A graph whose output is its own input (no nodes) indexed a layer before
# the first and crashed the importer (and the daemon).
g_self = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], [])
hostile("output_is_input", helper.make_model(g_self, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
        "is the graph's input")
# A weight with a zero dimension set a layer 65,536 channels wide from no values (about 1.5 GB
# allocated by a 250-byte file): refused, and the importer stays small while refusing it.
zero = TensorProto(name="k", data_type=TensorProto.FLOAT, dims=[65536, 0, 25, 25])
zero_bytes = graph([helper.make_node("Conv", ["x", "k"], ["c"], name="wide"), flat, gemm], [w, zero])
zpath = os.path.join(WORK, "zero_dim.onnx")
with open(zpath, "wb") as f:
    f.write(zero_bytes)
def peak_kb(args, errf):
    """The child's exit code and its own peak resident memory (KiB)."""
    with open(errf, "w") as ef:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=ef)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss


_, base_kb = peak_kb([TOPIARY, "--help"], os.path.join(WORK, "help.err"))  # the binary itself
errf = os.path.join(WORK, "zero_dim.err")
rc, kb = peak_kb([TOPIARY, "import", zpath, "--out", os.path.join(WORK, "zero_dim.h5")], errf)
err = open(errf).read()
check("hostile zero_dim_weight (%d bytes): refused in %d MB beyond the binary's %d MB"
      % (len(zero_bytes), (kb - base_kb) // 1024, base_kb // 1024),
      rc == 3 and "include a zero" in err and kb - base_kb < 100 * 1024, err.strip()[:300])
# A model whose weights are fine but whose layer reads more channels than its weight has:
# the network it describes needs more values than the file holds, refused before building.
narrow = helper.make_tensor("k", TensorProto.FLOAT, [4096, 1, 25, 25], np.zeros(4096 * 625, np.float32))
hostile("wider_than_its_weights",
        graph([helper.make_node("Conv", ["x", "k"], ["c"], name="wide"), flat, gemm], [w, narrow]),
        "but its file holds")
# A double beyond float range became +inf in the checkpoint (exit 0, a file every reader
# refuses).
big = helper.make_tensor("w", TensorProto.DOUBLE, [10, 192], np.full(1920, 1e300))
hostile("double_beyond_float", graph([flat, gemm], [big]), "beyond float32's range")
# Control characters in a node's name reach the terminal escaped, never raw.
esc = graph([flat, helper.make_node("Gemm", ["f", "w"], ["z"], transB=1, name="fc"),
             helper.make_node("Softmax", ["z"], ["y"], name="\x1b]0;pwned\x07soft\x1b[2J")], [w])
epath = os.path.join(WORK, "escape.onnx")
with open(epath, "wb") as f:
    f.write(esc)
r = run([TOPIARY, "import", epath, "--out", os.path.join(WORK, "escape.h5")])
check("a node name's escape sequences are not printed raw",
      r.returncode == 3 and "\x1b" not in r.stderr and "\x07" not in r.stderr and "?]0;pwned?soft?[2J" in r.stderr,
      repr(r.stderr[:300]))


# ReLU fusion sees through Identity and Dropout: Add(b, Relu(Identity(b))) must add b and relu(b),
# not relu(b) twice. Topiary's logits against numpy's, for the aliased graph and the plain one.
def bn_relu_add(alias_op):
    rng = np.random.default_rng(5)
    c = 3
    gamma, beta = rng.normal(size=c).astype(np.float32), rng.normal(size=c).astype(np.float32)
    mean, var = rng.normal(size=c).astype(np.float32), rng.uniform(0.5, 2, size=c).astype(np.float32)
    wk = rng.normal(size=(10, c * 64)).astype(np.float32)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, v.shape, v.ravel())
             for n, v in (("g", gamma), ("b", beta), ("m", mean), ("v", var), ("w", wk))]
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["bn"], name="bn", epsilon=1e-5)]
    if alias_op:
        nodes.append(helper.make_node(alias_op, ["bn"], ["al"], name="alias"))
    nodes += [helper.make_node("Relu", ["al" if alias_op else "bn"], ["r"], name="relu"),
              helper.make_node("Add", ["bn", "r"], ["a"], name="add"),
              helper.make_node("Flatten", ["a"], ["f"], name="flat"),
              helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1)]
    x = rng.normal(size=(4, c, 8, 8)).astype(np.float32)
    bn = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
    ref = (bn + np.maximum(bn, 0)).reshape(4, -1).astype(np.float64) @ wk.T.astype(np.float64)
    return graph(nodes, inits), x, ref


for alias_op in ("Identity", "Dropout", None):
    name = "relu_alias_" + (alias_op or "none").lower()
    model_bytes, x, ref = bn_relu_add(alias_op)
    onnx_path, ckpt = os.path.join(WORK, name + ".onnx"), os.path.join(WORK, name + ".h5")
    with open(onnx_path, "wb") as f:
        f.write(model_bytes)
    r = run([TOPIARY, "import", onnx_path, "--out", ckpt])
    ok = r.returncode == 0
    if ok:
        inp, outp = os.path.join(WORK, name + ".in"), os.path.join(WORK, name + ".out")
        x.tofile(inp)
        r = run([LOGITS, ckpt, inp, "4", outp])
        ok = r.returncode == 0
    rel = np.inf
    if ok:
        got = np.fromfile(outp, dtype=np.float32).reshape(ref.shape)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
    check("Add(bn, Relu(%s(bn))) imports exactly" % (alias_op or "-"), ok and rel <= 1e-4,
          "max relative difference %.2e %s" % (rel, r.stderr.strip()[:200]))

# --input fills a symbolic size.
path = os.path.join(WORK, "symbolic.onnx")
with open(path, "wb") as f:
    f.write(graph([flat, gemm], [w], in_dims=("N", 3, "H", 8)))
r = run([TOPIARY, "import", path, "--out", os.path.join(WORK, "symbolic.h5"), "--input", "8x8x3"])
check("--input fills a symbolic size", r.returncode == 0, r.stderr.strip())



# A PyTorch-trained Fashion-MNIST model, imported: the same test top-1 image count in Topiary
# (train.epochs 0 evaluates), then a block-pruning round fine-tunes it on the CPU.
def fashion(split):
    import gzip
    base = "/usr/share/datasets/fashion-mnist/"
    pre = "train" if split == "train" else "t10k"
    with gzip.open(base + pre + "-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(base + pre + "-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x, y


MEAN, STD = np.float32(0.2860), np.float32(0.3530)


def normalize(x):  # Topiary's batcher arithmetic in float32: (v * (1/255) - mean) * (1/std)
    return (x.astype(np.float32) * np.float32(1 / 255.0) - MEAN) * np.float32(1 / STD)


if os.path.isdir("/usr/share/datasets/fashion-mnist"):
    xs, ys = fashion("train")
    xt, yt = fashion("test")
    xs, ys, xt, yt = xs[:4096], ys[:4096], xt[:1000], yt[:1000]
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, 2, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
        nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    xin = torch.from_numpy(normalize(xs))
    for epoch in range(2):
        for i in range(0, len(xs), 64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xin[i:i + 64]), torch.from_numpy(ys[i:i + 64]).long())
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        torch_hits = int((net(torch.from_numpy(normalize(xt))).argmax(1).numpy() == yt).sum())
    onnx_path = os.path.join(WORK, "fashion.onnx")
    torch.onnx.export(net, xin[:1], onnx_path, opset_version=13)
    ckpt = os.path.join(WORK, "fashion.h5")
    r = run([TOPIARY, "import", onnx_path, "--out", ckpt, "--mean", str(MEAN), "--std", str(STD)])
    check("fashion model imports", r.returncode == 0, r.stdout.strip() + r.stderr.strip())

    def topiary_run(name, body):
        spec = os.path.join(WORK, name + ".textproto")
        with open(spec, "w") as f:
            f.write('name: "%s"\nseed: 1\ninit_from_checkpoint: "%s"\n'
                    'data { dataset: FASHION_MNIST batch_size: 64 train_limit: 4096 test_limit: 1000 }\n'
                    'device { kind: CPU }\n%s' % (name, ckpt, body))
        r = run([TOPIARY, "run", spec, "--json", "--out", os.path.join(WORK, name)])
        lines = [l for l in r.stdout.splitlines() if '"summary"' in l]
        return r, lines[-1] if lines else ""

    import json
    r, last = topiary_run("fashion_eval", "train { epochs: 0 }\n")
    summary = json.loads(last) if last else {}
    hits = round(summary.get("test_top1", -1) * 1000)
    check("imported model: Topiary's test top-1 image count equals PyTorch's",
          r.returncode == 0 and hits == torch_hits, "%d vs PyTorch's %d (%s)" % (hits, torch_hits, r.stderr.strip()[-300:]))
    r, last = topiary_run("fashion_prune", "train { optimizer { lr: 0.01 } }\n"
                          "pruning { method: BLOCK block_in: 4 block_out: 4 target: 0.5 "
                          "step_fraction: 1 finetune_epochs: 1 }\n")
    summary = json.loads(last) if last else {}
    check("imported model: a block-pruning round fine-tunes it on the CPU",
          r.returncode == 0 and summary.get("state") == "SUCCEEDED" and summary.get("test_top1", 0) > 0.5,
          "%s top-1 %s (%s)" % (summary.get("state"), summary.get("test_top1"), r.stderr.strip()[-300:]))
    import glob
    rounds = sorted(glob.glob(os.path.join(WORK, "fashion_prune", "checkpoints", "round-*.h5")))
    rr = run([TOPIARY, "inspect", rounds[-1] if rounds else "missing.h5", "--json"])
    check("the pruned imported checkpoint inspects", rr.returncode == 0 and '"sparsity"' in rr.stdout,
          rr.stderr.strip()[-300:])
else:
    print("SKIP fashion checks: /usr/share/datasets/fashion-mnist is missing (dataset-fashion-mnist)")

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
