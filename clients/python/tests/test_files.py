"""Files in and out of a real topiaryd over loopback: `topiary upload`/`download`/`files` and
Client.upload/download/files, and hostile uploads on the raw gRPC stub (oversized, truncated,
wrong checksum, more bytes than announced, '..', absolute and hidden paths, a planted link,
experiments/, many at once), each leaving nothing behind."""
import hashlib
import json
import os
import subprocess
import threading

import grpc
import pytest

import topiary
from topiary.v1 import service_pb2 as pb
from topiary.v1 import service_pb2_grpc


def cli(topiary_cli, daemon, *args, ok=True):
    r = subprocess.run([topiary_cli, *args, "--server", daemon.address], capture_output=True,
                       text=True, timeout=120)
    if ok:
        assert r.returncode == 0, r.stderr + r.stdout
    return r


def make_tree(root):
    """A small image-folder-like tree: two classes, files of awkward sizes (0 bytes, one
    chunk and a bit), and a hidden file the upload leaves out."""
    files = {}
    for cls, sizes in (("cls_a", (0, 1, 1000)), ("cls_b", (256 * 1024 + 17, 5))):
        os.makedirs(os.path.join(root, cls))
        for i, n in enumerate(sizes):
            data = os.urandom(n)
            path = os.path.join(root, cls, f"img{i}.bin")
            with open(path, "wb") as f:
                f.write(data)
            files[f"{cls}/img{i}.bin"] = data
    with open(os.path.join(root, ".DS_Store"), "wb") as f:
        f.write(b"x")
    return files


def staging_empty(daemon):
    return os.listdir(os.path.join(daemon.data_dir, ".uploads")) == []


def test_cli_upload_download_round_trip(daemon, topiary_cli, tmp_path):
    files = make_tree(str(tmp_path / "images"))
    r = cli(topiary_cli, daemon, "upload", str(tmp_path / "images"), "sets/images", "--json")
    out = json.loads(r.stdout)
    assert out["uploaded"] == len(files) and out["already_there"] == 0
    assert out["bytes"] == sum(len(d) for d in files.values())
    for rel, data in files.items():  # byte for byte in the data directory
        assert open(os.path.join(daemon.data_dir, "sets/images", rel), "rb").read() == data
    assert not os.path.exists(os.path.join(daemon.data_dir, "sets/images/.DS_Store"))
    # Run again: everything is there with the same checksum, nothing is sent.
    out = json.loads(cli(topiary_cli, daemon, "upload", str(tmp_path / "images"), "sets/images",
                         "--json").stdout)
    assert out["uploaded"] == 0 and out["already_there"] == len(files)
    # A changed local file is refused before anything is sent, naming it.
    with open(str(tmp_path / "images/cls_a/img1.bin"), "wb") as f:
        f.write(b"other")
    r = cli(topiary_cli, daemon, "upload", str(tmp_path / "images"), "sets/images", ok=False)
    assert r.returncode != 0 and "sets/images/cls_a/img1.bin" in r.stderr, r.stderr
    assert "never replace" in r.stderr
    assert open(os.path.join(daemon.data_dir, "sets/images/cls_a/img1.bin"), "rb").read() == \
        files["cls_a/img1.bin"]

    listing = json.loads(cli(topiary_cli, daemon, "files", "sets/images", "--sha256",
                             "--json").stdout)
    assert [f["path"] for f in listing["files"]] == sorted("sets/images/" + k for k in files)
    for f in listing["files"]:
        assert f["sha256"] == hashlib.sha256(files[f["path"][len("sets/images/"):]]).hexdigest()
    text = cli(topiary_cli, daemon, "files", "sets").stdout
    assert "sets/images/cls_b/img0.bin" in text

    # Download the folder into another place: the same bytes.
    out = json.loads(cli(topiary_cli, daemon, "download", "sets/images", str(tmp_path / "back"),
                         "--json").stdout)
    assert out["downloaded"] == len(files)
    for rel, data in files.items():
        assert open(str(tmp_path / "back" / rel), "rb").read() == data
    # A broken download continues from its .part: a wrong-length part of the big file is
    # completed, a part with the right bytes is kept.
    big = files["cls_b/img0.bin"]
    dest = str(tmp_path / "one.bin")
    with open(dest + ".part", "wb") as f:
        f.write(big[:100000])
    out = json.loads(cli(topiary_cli, daemon, "download", "sets/images/cls_b/img0.bin", dest,
                         "--json").stdout)
    assert out["downloaded"] == 1 and open(dest, "rb").read() == big
    assert not os.path.exists(dest + ".part")
    # A part whose bytes are not the file's is caught by the checksum and removed.
    dest2 = str(tmp_path / "two.bin")
    with open(dest2 + ".part", "wb") as f:
        f.write(b"\0" * 5000)
    r = cli(topiary_cli, daemon, "download", "sets/images/cls_b/img0.bin", dest2, ok=False)
    assert r.returncode == 3 and "SHA-256" in r.stderr, r.stderr
    assert not os.path.exists(dest2) and not os.path.exists(dest2 + ".part")
    cli(topiary_cli, daemon, "download", "sets/images/cls_b/img0.bin", dest2)
    assert open(dest2, "rb").read() == big
    # A local file with other content is not replaced.
    with open(str(tmp_path / "three.bin"), "wb") as f:
        f.write(b"mine")
    r = cli(topiary_cli, daemon, "download", "sets/images/cls_b/img1.bin",
            str(tmp_path / "three.bin"), ok=False)
    assert r.returncode != 0 and "not replaced" in r.stderr
    assert open(str(tmp_path / "three.bin"), "rb").read() == b"mine"
    # Paths the daemon does not serve.
    r = cli(topiary_cli, daemon, "download", "../etc/passwd", str(tmp_path / "p"), ok=False)
    assert r.returncode == 3 and "'..'" in r.stderr, r.stderr
    r = cli(topiary_cli, daemon, "download", "nothing/here.h5", str(tmp_path / "p"), ok=False)
    assert r.returncode == 4, r.stderr
    assert staging_empty(daemon)


def test_client_upload_download(daemon, tmp_path):
    files = make_tree(str(tmp_path / "tree"))
    seen = []
    with topiary.Client(daemon.address) as c:
        out = c.upload(str(tmp_path / "tree"), "py/tree", progress=lambda *p: seen.append(p))
        assert out["uploaded"] == len(files) and out["hidden_left_out"] == 1
        assert seen[-1] == (len(files), len(files), out["bytes"], out["bytes"])
        assert c.upload(str(tmp_path / "tree"), "py/tree")["already_there"] == len(files)
        single = c.upload(str(tmp_path / "tree/cls_a/img2.bin"), "py/single.bin")
        assert single["uploaded"] == 1
        assert [f.path for f in c.files("py/single.bin")] == ["py/single.bin"]
        back = c.download("py/tree", str(tmp_path / "back"))
        assert back["downloaded"] == len(files)
        for rel, data in files.items():
            assert open(str(tmp_path / "back" / rel), "rb").read() == data
        with pytest.raises(FileExistsError):
            with open(str(tmp_path / "tree/cls_a/img0.bin"), "wb") as f:
                f.write(b"changed")
            c.upload(str(tmp_path / "tree"), "py/tree")
        with pytest.raises(topiary.NotFound):
            c.download("py/none")


# Hostile uploads on the raw stub: each is refused with a clear message, and neither the
# destination nor a staged part is left.
def header(path, data, size=None, sha=None):
    return pb.UploadChunk(header=pb.FileHeader(
        path=path, size=len(data) if size is None else size,
        sha256=sha or hashlib.sha256(data).hexdigest()))


def refused(stub, chunks, code, words):
    with pytest.raises(grpc.RpcError) as e:
        stub.UploadFiles(iter(chunks))
    assert e.value.code() == code, e.value.details()
    for w in words:
        assert w in e.value.details(), e.value.details()


def test_hostile_uploads_leave_nothing(daemon, tmp_path):
    stub = service_pb2_grpc.TopiaryStub(grpc.insecure_channel(daemon.address))
    data = os.urandom(3000)
    d = daemon.data_dir
    cases = [
        ("huge.bin", [header("huge.bin", b"", size=3 << 30)], grpc.StatusCode.RESOURCE_EXHAUSTED,
         ["header.size", "--max_file_bytes"]),
        ("trunc.bin", [header("trunc.bin", data), pb.UploadChunk(data=data[:1000])],
         grpc.StatusCode.DATA_LOSS, ["1000 bytes arrived of the 3000", "truncated"]),
        ("badsum.bin", [header("badsum.bin", data, sha="0" * 64), pb.UploadChunk(data=data)],
         grpc.StatusCode.DATA_LOSS, ["SHA-256", "not the header's"]),
        ("more.bin", [header("more.bin", data), pb.UploadChunk(data=data + b"x")],
         grpc.StatusCode.INVALID_ARGUMENT, ["more bytes than its header's size"]),
        ("notsum.bin", [header("notsum.bin", data, sha="xyz"), pb.UploadChunk(data=data)],
         grpc.StatusCode.INVALID_ARGUMENT, ["header.sha256", "not a SHA-256"]),
        ("../escape.bin", [header("../escape.bin", data), pb.UploadChunk(data=data)],
         grpc.StatusCode.INVALID_ARGUMENT, ["'..'"]),
        ("/tmp/abs.bin", [header("/tmp/abs.bin", data), pb.UploadChunk(data=data)],
         grpc.StatusCode.INVALID_ARGUMENT, ["absolute"]),
        (".uploads/x.part", [header(".uploads/x.part", data), pb.UploadChunk(data=data)],
         grpc.StatusCode.INVALID_ARGUMENT, ["hidden"]),
        ("experiments/exp-9999/checkpoints/round-001.h5",
         [header("experiments/exp-9999/checkpoints/round-001.h5", data),
          pb.UploadChunk(data=data)], grpc.StatusCode.PERMISSION_DENIED, ["experiments/"]),
        ("nohead.bin", [pb.UploadChunk(data=data)], grpc.StatusCode.INVALID_ARGUMENT,
         ["before any header"]),
        ("a\nb.bin", [header("a\nb.bin", data)], grpc.StatusCode.INVALID_ARGUMENT,
         ["control character"]),
    ]
    for path, chunks, code, words in cases:
        refused(stub, chunks, code, words)
        assert not os.path.lexists(os.path.join(d, path)), path
    # A planted link out of the data directory is not followed.
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), os.path.join(d, "planted"))
    refused(stub, [header("planted/x.bin", data), pb.UploadChunk(data=data)],
            grpc.StatusCode.PERMISSION_DENIED, ["outside the data directory"])
    with open(str(outside / "secret"), "w") as f:
        f.write("s")
    with pytest.raises(grpc.RpcError) as e:
        list(stub.DownloadFile(pb.DownloadFileRequest(path="planted/secret")))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert os.listdir(str(outside)) == ["secret"]
    # An existing file is never replaced.
    with open(os.path.join(d, "kept.bin"), "wb") as f:
        f.write(b"kept")
    refused(stub, [header("kept.bin", data), pb.UploadChunk(data=data)],
            grpc.StatusCode.ALREADY_EXISTS, ["never replace"])
    assert open(os.path.join(d, "kept.bin"), "rb").read() == b"kept"
    # Two files in one stream, the second bad: the first stays (and the error says so).
    refused(stub, [header("two/first.bin", data), pb.UploadChunk(data=data),
                   header("two/second.bin", data, sha="1" * 64), pb.UploadChunk(data=data)],
            grpc.StatusCode.DATA_LOSS, ["1 file(s) before it in this upload were stored"])
    assert open(os.path.join(d, "two/first.bin"), "rb").read() == data
    assert not os.path.exists(os.path.join(d, "two/second.bin"))
    # A client that goes away mid-file: its part is removed.
    gate = threading.Event()

    def cut():
        yield header("cut.bin", data)
        yield pb.UploadChunk(data=data[:10])
        gate.wait(10)
        raise RuntimeError("client dies")

    future = stub.UploadFiles.future(cut())
    for _ in range(100):
        if os.listdir(os.path.join(d, ".uploads")):
            break
        threading.Event().wait(0.05)
    gate.set()
    with pytest.raises(Exception):
        future.result(timeout=30)
    for _ in range(100):
        if staging_empty(daemon):
            break
        threading.Event().wait(0.05)
    assert staging_empty(daemon) and not os.path.exists(os.path.join(d, "cut.bin"))


def test_many_uploads_at_once_are_bounded(daemon):
    stub = service_pb2_grpc.TopiaryStub(grpc.insecure_channel(daemon.address))
    gate = threading.Event()
    data = b"y" * 10

    def held(i):
        yield header(f"many/{i}.bin", data)
        gate.wait(30)
        yield pb.UploadChunk(data=data)

    futures = [stub.UploadFiles.future(held(i)) for i in range(8)]
    for _ in range(200):  # all eight under way
        if len(os.listdir(os.path.join(daemon.data_dir, ".uploads"))) == 8:
            break
        threading.Event().wait(0.05)
    with pytest.raises(grpc.RpcError) as e:
        stub.UploadFiles(iter([header("many/extra.bin", data), pb.UploadChunk(data=data)]))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "uploads and downloads are under way" in e.value.details()
    gate.set()
    for f in futures:
        assert len(f.result(timeout=30).files) == 1
    assert sorted(os.listdir(os.path.join(daemon.data_dir, "many"))) == \
        sorted(f"{i}.bin" for i in range(8))
    assert staging_empty(daemon)
