#!/usr/bin/env python3
"""Computes (and checks) a Topiary checkpoint's metadata checksum with h5py.

format_version 2 stores, as the root attribute `metadata_crc32c`, the CRC-32C of a canonical
text of every group attribute, dataset path, element type, shape and dataset attribute
(docs/checkpoint-format.md). A tool that writes or edits a checkpoint recomputes it with
`--fix`; Topiary refuses a file whose checksum does not match.

    python3 examples/checkpoint_checksum.py CKPT.h5 [--fix]
"""
import sys

import h5py
import numpy as np


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def attr_lines(attrs, skip=None):
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
    groups, datasets = {"/": f}, {}
    f.visititems(lambda name, obj: (groups if isinstance(obj, h5py.Group) else datasets)
                 .__setitem__("/" + name, obj))
    text = b""
    for path in sorted(groups, key=str.encode):
        skip = "metadata_crc32c" if path == "/" else None
        lines = attr_lines(groups[path].attrs, skip)
        if lines:  # groups without attributes are left out
            text += b"G %s\n" % path.encode() + lines
    for path in sorted(datasets, key=str.encode):
        d = datasets[path]
        kind = b"u8" if d.dtype == np.uint8 else b"f32"
        text += b"D %s %s %s\n" % (path.encode(), kind, "x".join(map(str, d.shape)).encode())
        text += attr_lines(d.attrs)
    return text


def main():
    path = sys.argv[1]
    with h5py.File(path, "r+" if "--fix" in sys.argv else "r") as f:
        want = crc32c(metadata_text(f))
        if "--fix" in sys.argv:
            f.attrs["metadata_crc32c"] = np.int64(want)
            print("metadata_crc32c set to", want)
            return 0
        have = int(f.attrs.get("metadata_crc32c", -1))
        print("metadata_crc32c", have, "ok" if have == want else "MISMATCH (computed %d)" % want)
        return 0 if have == want else 1


if __name__ == "__main__":
    sys.exit(main())
