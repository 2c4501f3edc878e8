#!/usr/bin/env python3
"""Computes (and checks) a Topiary checkpoint's two checksums with h5py.

format_version 2 stores, as the root attribute `metadata_crc32c`, the CRC-32C of a canonical
text of every group attribute, dataset path, element type, shape and dataset attribute; the
file's first 512 bytes (an HDF5 user block) hold its seal, a CRC-32 of every byte after them
(docs/checkpoint-format.md). A tool that edits a checkpoint in place recomputes both with
`--fix`; Topiary refuses a file where either does not match. Needs the Python package
(`pip install ./clients/python`), whose topiary.checksum holds the arithmetic.

    python3 examples/checkpoint_checksum.py CKPT.h5 [--fix]
"""
import sys

import h5py
import numpy as np

from topiary.checksum import CHECKSUM_ATTR, metadata_crc32c, seal, seal_error


def main():
    path = sys.argv[1]
    with h5py.File(path, "r+" if "--fix" in sys.argv else "r") as f:
        want = metadata_crc32c(f)
        if "--fix" in sys.argv:
            f.attrs[CHECKSUM_ATTR] = np.int64(want)
            print(CHECKSUM_ATTR, "set to", want)
        else:
            have = int(f.attrs.get(CHECKSUM_ATTR, -1))
            print(CHECKSUM_ATTR, have, "ok" if have == want else "MISMATCH (computed %d)" % want)
    if "--fix" in sys.argv:
        seal(path)  # after the file is closed: the seal covers every byte
        print("seal written")
        return 0
    problem = seal_error(open(path, "rb").read())
    print("seal", "ok" if problem is None else problem[0])
    return 0 if have == want and problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
