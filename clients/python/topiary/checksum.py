"""The metadata checksum of a Topiary checkpoint (root attribute `metadata_crc32c`).

HDF5's Fletcher-32 filter covers the data, not the attributes, names and shapes; format
version 2 therefore stores the CRC-32C (Castagnoli, unmasked) of a canonical text of all of
them (docs/checkpoint-format.md, "Integrity"). A tool that edits a checkpoint recomputes it
with metadata_crc32c(); Topiary refuses a file whose stored value differs.
"""
from __future__ import annotations

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
