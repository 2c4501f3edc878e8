"""Issue 41's acceptance: a researcher with a daemon on another machine (here: loopback, its
data directory shared with nothing the client has) and only their own PyTorch CNN and an
image folder. Through the CLI, then through the Python client: upload the ONNX model and the
folder, import, evaluate without a spec, submit pruning rounds, compare experiments, evaluate
several multipliers in the daemon, export, download the last checkpoint and its ONNX export,
and load the checkpoint into a fresh instance of their own nn.Module: its logits equal the
ONNX export's in onnxruntime (1e-4)."""
import gzip
import json
import os
import struct
import subprocess
import zlib

import numpy as np
import pytest

import topiary

torch = pytest.importorskip("torch")
nn = torch.nn
onnxruntime = pytest.importorskip("onnxruntime")

FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = np.float32(0.2860), np.float32(0.3530)


class MyNet(nn.Module):
    """The user's own module: their names, batch norm, a flatten of a 7x7 map."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2))
        self.classifier = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def png_gray(pixels: np.ndarray) -> bytes:
    h, w = pixels.shape
    raw = b"".join(b"\0" + pixels[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def idx(name, offset):
    with gzip.open(os.path.join(FASHION, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def normalize(x):
    return torch.from_numpy((x.astype(np.float32) * np.float32(1 / 255.0) - MEAN) *
                            np.float32(1 / STD))


@pytest.fixture(scope="module")
def client_side(tmp_path_factory):
    """The client's folder: an image folder of Fashion-MNIST (train 600, val 200) and the
    user's module, trained a little in PyTorch and exported to ONNX (eval mode: batch norm
    folded into the convolutions)."""
    if not os.path.exists(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")):
        pytest.skip(f"Fashion-MNIST is not in {FASHION} (Debian's dataset-fashion-mnist)")
    root = tmp_path_factory.mktemp("client")
    x = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)[:800]
    y = idx("train-labels-idx1-ubyte.gz", 8)[:800]
    for i in range(len(x)):
        split = "train" if i < 600 else "val"
        folder = root / "images" / split / f"class{y[i]}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:04d}.png").write_bytes(png_gray(x[i]))
    torch.manual_seed(0)
    net = MyNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    xt, yt = normalize(x[:600, None]), torch.from_numpy(y[:600].astype(np.int64))
    net.train()
    for _ in range(3):
        for i in range(0, 600, 50):
            opt.zero_grad()
            nn.functional.cross_entropy(net(xt[i:i + 50]), yt[i:i + 50]).backward()
            opt.step()
    net.eval()
    torch.onnx.export(net, xt[:1], str(root / "mynet.onnx"), opset_version=13,
                      input_names=["input"], output_names=["logits"])
    return {"root": root, "val_x": x[600:], "val_y": y[600:]}


def spec(name, target):
    return f'''name: "{name}" seed: 1
init_from_checkpoint: "models/mynet.h5"
data {{ dataset: IMAGE_FOLDER path: "sets/images" batch_size: 50
       image_folder {{ image_size: 28 channels: 1 }} }}
train {{ optimizer {{ lr: 0.01 }} }}
pruning {{ method: BLOCK block_in: 4 block_out: 4 target: {target} step_fraction: 0.5
          finetune_epochs: 1 }}
device {{ kind: CPU }}
'''


def same_logits(ckpt_path, onnx_path, val_x):
    """The user's module with the checkpoint's weights, against the ONNX export of the same
    checkpoint in onnxruntime (raw pixels in: its normalization is in the graph)."""
    mine = MyNet()
    mapping = topiary.to_torch(ckpt_path, mine)
    mine.eval()
    with torch.no_grad():
        ours = mine(normalize(val_x[:, None])).numpy()
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"input": val_x[:, None].astype(np.float32)})[0]
    assert ours.shape == theirs.shape == (len(val_x), 10)
    assert np.abs(ours - theirs).max() < 1e-4, np.abs(ours - theirs).max()
    # The imported graph as a module of its own (to_torch_model): the same logits too.
    graph = topiary.to_torch_model(topiary.load_checkpoint(str(ckpt_path)))
    with torch.no_grad():
        built = graph(normalize(val_x[:, None])).numpy()
    assert np.abs(built - theirs).max() < 1e-4, np.abs(built - theirs).max()
    # The pruned zeros arrived: the conv kernels are as sparse as the checkpoint says.
    ckpt = topiary.load_checkpoint(str(ckpt_path))
    for layer, module in mapping.items():
        params = ckpt.layers.get(layer)
        if params is not None and params.keep() is not None:
            weight = dict(mine.named_modules())[module].weight.detach().numpy()
            assert (weight[~params.keep()] == 0).all()
    return mapping


def test_cli_workflow(daemon, topiary_cli, client_side):
    root = client_side["root"]

    def t(*args, ok=True):
        r = subprocess.run([topiary_cli, *map(str, args), "--server", daemon.address],
                           capture_output=True, text=True, timeout=600)
        if ok:
            assert r.returncode == 0, f"topiary {args}: {r.stderr}{r.stdout}"
        return r

    def tj(*args):
        return [json.loads(line) for line in t(*args, "--json").stdout.splitlines()]

    # Nothing of the client's folder is visible to the daemon: only what is uploaded.
    assert not str(daemon.data_dir).startswith(str(root))
    t("upload", root / "mynet.onnx", "models/mynet.onnx")
    up = tj("upload", root / "images", "sets/images")[0]
    assert up["uploaded"] == 800
    imported = tj("import", "--remote", "models/mynet.onnx", "--out", "models/mynet.h5",
                  "--mean", MEAN, "--std", STD, "--data", "folder:sets/images")[0]
    assert imported["checkpoint"] == "models/mynet.h5"
    # Evaluate without a spec: the data set recorded at import.
    dense = tj("evaluate", "--remote", "models/mynet.h5")[0]
    assert dense["images"] == 200 and dense["top1"] > 0.4
    ids = []
    for name, target in (("mynet-50", 0.5), ("mynet-70", 0.7)):
        (root / f"{name}.textproto").write_text(spec(name, target))
        ids.append(tj("submit", root / f"{name}.textproto")[0]["id"])
    for i in ids:
        assert t("watch", i).returncode == 0
    compared = tj("compare", *ids, "--png", root / "curves.png")[0]
    assert [e["id"] for e in compared["experiments"]] == ids
    assert {d["field"] for d in compared["spec_differences"]} >= {"pruning.target"}
    assert all(len(e["rounds"]) >= 2 and e["rounds"][0]["round"] == 0
               for e in compared["experiments"])
    assert (root / "curves.png").read_bytes()[:4] == b"\x89PNG"
    text = t("compare", *ids).stdout
    assert "pruning.target" in text and "per round" in text
    listing = t("list").stdout
    assert "BLOCK 4x4" in listing and "mynet-70" in listing
    last = tj("checkpoints", ids[1])[0]["checkpoints"][-1]["path"]
    rows = tj("evaluate", "--remote", last, "--multipliers", "mul8u_L40,drum:6")
    assert [r["multiplier"] for r in rows] == ["mul8u_L40", "drum:6"]
    assert all(0 < r["top1"] <= 1 for r in rows) and rows[0]["power_mw"] == pytest.approx(0.189)
    t("export", "--remote", last, "--onnx", "exports/mynet-70.onnx", "--batch", "dynamic")
    t("download", last, root / "mynet-70.h5")
    t("download", "exports/mynet-70.onnx", root / "mynet-70.onnx")
    t("download", f"experiments/{ids[1]}/events.jsonl", root / "events.jsonl")
    assert '"summary"' in (root / "events.jsonl").read_text()
    mapping = same_logits(root / "mynet-70.h5", root / "mynet-70.onnx", client_side["val_x"])
    assert set(mapping.values()) >= {"features.0", "features.4", "classifier"}


def test_client_workflow(daemon, client_side, tmp_path):
    root = client_side["root"]
    with topiary.Client(daemon.address) as c:
        c.upload(str(root / "mynet.onnx"), "py/mynet.onnx")
        assert c.upload(str(root / "images"), "py/images")["uploaded"] == 800
        c.import_model("py/mynet.onnx", "py/mynet.h5", mean=[MEAN], std=[STD],
                       data="folder:py/images")
        assert c.evaluate("py/mynet.h5")[0]["images"] == 200
        text = spec("py-50", 0.5).replace("models/mynet.h5", "py/mynet.h5") \
                                 .replace("sets/images", "py/images")
        a = c.submit(text)
        b = c.submit(text.replace('"py-50"', '"py-60"').replace("target: 0.5", "target: 0.6"))
        for e in (a, b):
            assert c.wait(e.id).state == topiary.SUCCEEDED
        compared = c.compare([a.id, b.id])
        assert compared["spec_differences"]["pruning.target"] == [0.5, 0.6]
        assert compared["experiments"][1]["rounds"][-1]["sparsity"] > 0.05
        last = c.checkpoints(b.id)[-1].path
        rows = c.evaluate(last, multipliers=["mul8u_L40", "drum:6"])
        assert len(rows) == 2
        c.export_onnx(last, "py/exports/b.onnx", batch="dynamic")
        c.download(last, str(tmp_path / "b.h5"))
        c.download("py/exports/b.onnx", str(tmp_path / "b.onnx"))
    same_logits(tmp_path / "b.h5", tmp_path / "b.onnx", client_side["val_x"])
