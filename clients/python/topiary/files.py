"""Files in and out of topiaryd's data directory (the UploadFiles, DownloadFile and ListFiles
calls; docs/remote.md, "Files"), as `topiary upload`/`download`/`files` do them:

- every file travels with its SHA-256, checked at the other end;
- an upload skips files already there with the same checksum, so a failed one is run again;
  a file there with other content is refused before anything is sent (never replaced);
- a download writes FILE.part and continues it when run again, checks the whole file's
  checksum and then renames it; a local file with other content is never replaced.

Client.upload / Client.download / Client.files call these.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import grpc

from topiary.errors import InvalidArgument
from topiary.v1 import service_pb2 as pb

CHUNK = 256 * 1024  # well under the daemon's 1 MiB a message
# progress(files_done, files_total, bytes_done, bytes_total)
Progress = Callable[[int, int, int, int], None]


def _feed(h, path: str, limit: Optional[int] = None):
    """Feeds the file's first `limit` bytes (all by default) to the hash `h`; returns it."""
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h


def sha256_of(path: str) -> str:
    return _feed(hashlib.sha256(), path).hexdigest()


def local_files(local: str, remote: str) -> Tuple[List[Tuple[str, str]], int]:
    """(local path, remote path) of the file, or of the files under the folder (sorted), and
    how many hidden names were left out (the daemon refuses them)."""
    if not os.path.isdir(local):
        return [(local, remote)], 0
    out, hidden = [], 0
    for root, dirs, names in os.walk(local):
        hidden += sum(1 for d in dirs if d.startswith("."))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith("."):
                hidden += 1
                continue
            path = os.path.join(root, name)
            if os.path.isfile(path):
                rel = os.path.relpath(path, local).replace(os.sep, "/")
                out.append((path, f"{remote}/{rel}"))
    out.sort(key=lambda p: p[1])
    return out, hidden


def _chunks(plan: List[Tuple[str, str, int, str]], progress: Optional[Progress],
            total: int) -> Iterator[pb.UploadChunk]:
    done_bytes = 0
    for i, (path, remote, size, digest) in enumerate(plan):
        yield pb.UploadChunk(header=pb.FileHeader(path=remote, size=size, sha256=digest))
        with open(path, "rb") as f:
            while True:
                block = f.read(CHUNK)
                if not block:
                    break
                done_bytes += len(block)
                yield pb.UploadChunk(data=block)
                if progress:
                    progress(i, len(plan), done_bytes, total)
        if progress:
            progress(i + 1, len(plan), done_bytes, total)


def upload(client, local: str, remote: str, progress: Optional[Progress] = None) -> Dict:
    """Uploads `local` (a file or folder) to `remote` in the data directory; returns
    {"path", "uploaded", "already_there", "bytes"}."""
    remote = remote.rstrip("/")
    if not os.path.exists(local):
        raise FileNotFoundError(local)
    pairs, hidden = local_files(local, remote)
    there = {f.path: f.sha256 for f in client.files(remote, sha256=True, missing_ok=True)}
    plan, same, conflicts = [], 0, []
    for path, dest in pairs:
        digest = sha256_of(path)
        if dest not in there:
            plan.append((path, dest, os.path.getsize(path), digest))
        elif there[dest] == digest:
            same += 1
        else:
            conflicts.append(dest)
    if conflicts:
        raise FileExistsError(f"the data directory already has different {', '.join(conflicts[:5])}; "
                              "uploads never replace a file (nothing was sent)")
    summary = pb.UploadSummary()
    if plan:
        total = sum(p[2] for p in plan)
        summary = client._stream_call("UploadFiles", _chunks(plan, progress, total))
    return {"path": remote, "uploaded": len(summary.files), "already_there": same,
            "bytes": summary.bytes, "hidden_left_out": hidden}


def _fetch(client, info: pb.FileInfo, dest: str, progress, done: int, count: int,
           moved: List[int], total: int) -> None:
    part = dest + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    if offset > info.size:
        offset = 0
    h = _feed(hashlib.sha256(), part, offset) if offset else hashlib.sha256()
    expected = ""
    moved[0] += offset
    with open(part, "ab" if offset else "wb") as out:
        for chunk in client._stream_out("DownloadFile",
                                        pb.DownloadFileRequest(path=info.path, offset=offset)):
            if chunk.HasField("info"):
                expected = chunk.info.sha256
            out.write(chunk.data)
            h.update(chunk.data)
            moved[0] += len(chunk.data)
            if progress:
                progress(done, count, moved[0], total)
    if h.hexdigest() != expected:
        os.remove(part)
        raise InvalidArgument(grpc.StatusCode.DATA_LOSS,
                              f"{info.path}: what arrived has SHA-256 {h.hexdigest()}, the "
                              f"daemon's file {expected}; download again")
    os.replace(part, dest)


def download(client, remote: str, local: Optional[str] = None,
             progress: Optional[Progress] = None) -> Dict:
    """Downloads `remote` (a file or folder) to `local` (default: its name, here); returns
    {"path", "downloaded", "already_there", "bytes"}."""
    remote = remote.rstrip("/")
    local = local or os.path.basename(remote)
    files = client.files(remote, sha256=True)
    single = len(files) == 1 and files[0].path == remote
    todo, same = [], 0
    for f in files:
        dest = local if single else local + f.path[len(remote):]
        if os.path.exists(dest):
            if sha256_of(dest) == f.sha256:
                same += 1
                continue
            raise FileExistsError(f"{dest} exists with other content; not replaced")
        todo.append((f, dest))
    total, moved = sum(f.size for f, _ in todo), [0]
    for i, (f, dest) in enumerate(todo):
        _fetch(client, f, dest, progress, i, len(todo), moved, total)
    return {"path": local, "downloaded": len(todo), "already_there": same, "bytes": total}
