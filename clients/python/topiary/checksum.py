"""The metadata checksum of a Topiary checkpoint (root attribute `metadata_crc32c`).

HDF5's Fletcher-32 filter covers the data, not the attributes, names and shapes; format
version 2 therefore stores the CRC-32C (Castagnoli, unmasked) of a canonical text of all of
them (docs/checkpoint-format.md, "Integrity"). A tool that edits a checkpoint recomputes it
with metadata_crc32c(); Topiary refuses a file whose stored value differs.
"""
from __future__ import annotations

import zlib

import h5py
import numpy as np

CHECKSUM_ATTR = "metadata_crc32c"


def _table():
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _attr_lines(attrs, skip=None) -> bytes:
    out = b""
    for name in sorted(attrs.keys(), key=lambda n: n.encode()):
        if name == skip:
            continue
        value = attrs[name]
        if isinstance(value, (bytes, str)):
            text = value.encode() if isinstance(value, str) else value
            out += b"  %s=s:%d:%s\n" % (name.encode(), len(text), text)
        elif isinstance(value, (float, np.floating)):
            out += b"  %s=d:%s\n" % (name.encode(), ("%.17g" % value).encode())
        else:
            out += b"  %s=i:%d\n" % (name.encode(), int(value))
    return out


def metadata_text(f: h5py.File) -> bytes:
    """The canonical text the checksum covers: groups with attributes, then datasets, by path."""
    groups, datasets = {"/": f}, {}
    f.visititems(lambda name, obj: (groups if isinstance(obj, h5py.Group) else datasets)
                 .__setitem__("/" + name, obj))
    text = b""
    for path in sorted(groups, key=str.encode):
        lines = _attr_lines(groups[path].attrs, CHECKSUM_ATTR if path == "/" else None)
        if lines:  # groups without attributes are left out
            text += b"G %s\n" % path.encode() + lines
    for path in sorted(datasets, key=str.encode):
        d = datasets[path]
        kind = b"u8" if d.dtype == np.uint8 else b"f32"
        text += b"D %s %s %s\n" % (path.encode(), kind, "x".join(map(str, d.shape)).encode())
        text += _attr_lines(d.attrs)
    return text


def metadata_crc32c(f: h5py.File) -> int:
    """What the root attribute metadata_crc32c must hold for the file as it is."""
    return crc32c(metadata_text(f))


# The seal: the file's first SEAL_BYTES (an HDF5 user block, which libhdf5 skips) hold
# "topiary-seal 1\nbytes N\ncrc32 XXXXXXXX\n", zero padded, for the N bytes after them (zlib's
# CRC-32). Readers check it before libhdf5 parses anything (docs/checkpoint-format.md).
SEAL_BYTES = 512
SEAL_MAGIC = b"topiary-seal 1\n"
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def seal_text(n: int, crc: int) -> bytes:
    return (SEAL_MAGIC + b"bytes %d\ncrc32 %08x\n" % (n, crc)).ljust(SEAL_BYTES, b"\0")


def seal_error(data: bytes):
    """None when `data` (a whole file) carries a valid seal, else why not (and whether it is
    damage: True, or a file that is not sealed at all: False)."""
    if not data.startswith(SEAL_MAGIC) or len(data) < SEAL_BYTES:
        if data.startswith(_HDF5_SIGNATURE) or data[SEAL_BYTES:SEAL_BYTES + 8] == _HDF5_SIGNATURE:
            return ("an HDF5 file without Topiary's seal (its whole-file checksum): written by "
                    "another tool or a Topiary before 0.9; `topiary seal FILE` adds one"), False
        return "not an HDF5 file", False
    header = data[:SEAL_BYTES]
    try:
        lines = header[len(SEAL_MAGIC):].split(b"\n")
        n = int(lines[0].removeprefix(b"bytes "))
        crc = int(lines[1].removeprefix(b"crc32 "), 16)
    except (ValueError, IndexError):
        return "its seal is damaged", True
    if header != seal_text(n, crc):
        return "its seal is damaged", True
    if n != len(data) - SEAL_BYTES:
        return (f"truncated or extended: its seal counts {n} bytes after it, the file holds "
                f"{len(data) - SEAL_BYTES}"), True
    if zlib.crc32(memoryview(data)[SEAL_BYTES:]) != crc:
        return "whole-file checksum mismatch (the file is damaged)", True
    return None


def seal(path: str) -> None:
    """Writes the seal of `path` as it is, whose first 512 bytes are an HDF5 user block (h5py:
    File(path, "w", userblock_size=512)). For tools that edit a checkpoint: after the edit
    (and metadata_crc32c), seal it again."""
    with open(path, "r+b") as f:
        data = f.read()
        if len(data) < SEAL_BYTES or data[SEAL_BYTES:SEAL_BYTES + 8] != _HDF5_SIGNATURE:
            raise ValueError(f"{path}: no 512-byte HDF5 user block to hold a seal")
        f.seek(0)
        f.write(seal_text(len(data) - SEAL_BYTES, zlib.crc32(memoryview(data)[SEAL_BYTES:])))
