#!/usr/bin/env python3
"""The most block sparsity can speed up resnet50's convolutions (docs/PERFORMANCE.md, issue 44).

Each convolution takes the larger of its multiply-adds at a measured rate and its activation
traffic (input read and output written once, bf16) at a memory bandwidth; a masked layer's
multiply-adds shrink to the kept fraction, its activations do not. The network is its
convolutions alone, as if every batch norm, ReLU and add were fused away: an upper bound.

  conv_ceiling.py [--batch 256] [--tmacs 380] [--tbps 3.0] [--floors 1]

--floors 1 prints instead each distinct 3x3 layer's activation traffic and the time it takes at
--tbps: no kernel that reads the input and writes the output once runs the layer faster, at any
kept fraction (so a layer whose dense time is less than 1.6x that floor cannot meet a 1.6x goal).
"""
import argparse


def layers(batch):
    """(name, multiply-adds, activation bytes, stage) of resnet50's convolutions at 224 px."""
    out = []

    def conv(name, hw, cin, cout, k, stride, stage):
        ho = hw // stride
        macs = batch * ho * ho * cout * cin * k * k
        act = 2 * batch * (hw * hw * cin + ho * ho * cout)
        out.append((name, macs, act, stage))

    conv("stem", 224, 1, 64, 7, 2, 0)
    hw, cin = 56, 64
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                    (512, 3, 2)], start=1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            conv(f"stage{stage}.block{b}.conv1", hw, cin, width, 1, 1, stage)
            conv(f"stage{stage}.block{b}.conv2", hw, width, width, 3, s, stage)
            conv(f"stage{stage}.block{b}.conv3", hw // s, width, 4 * width, 1, 1, stage)
            if b == 0:
                conv(f"stage{stage}.block{b}.shortcut", hw, cin, 4 * width, 1, s, stage)
            hw, cin = hw // s, 4 * width
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tmacs", type=float, default=380, help="multiply-adds per second, 1e12")
    p.add_argument("--tbps", type=float, default=3.0, help="memory bandwidth, TB/s")
    p.add_argument("--floors", type=int, default=0, help="1: each 3x3 layer's memory floor")
    a = p.parse_args()
    convs = layers(a.batch)
    if a.floors:
        seen = set()
        for name, macs, act, _ in convs:
            if ".conv2" not in name or (macs, act) in seen:
                continue
            seen.add((macs, act))
            print(f"{name}: {act / 1e6:.1f} MB of activations, {1e3 * act / (a.tbps * 1e12):.4f} ms"
                  f" at {a.tbps} TB/s; multiply-adds {1e3 * macs / (a.tmacs * 1e12):.4f} ms"
                  f" at {a.tmacs} TMAC/s")
        return

    def ms(kept, first_masked_stage):
        t = 0.0
        for _, macs, act, stage in convs:
            f = kept if 1 <= stage and stage >= first_masked_stage else 1.0
            t += max(macs * f / (a.tmacs * 1e12), act / (a.tbps * 1e12))
        return 1e3 * t

    for first, what in ((2, "stages 2-4 masked"), (1, "every stage masked")):
        dense = ms(1.0, first)
        row = ", ".join(f"{k:.0%} kept {dense / ms(k, first):.2f}x" for k in (0.5, 0.25))
        print(f"{what}: dense {dense:.2f} ms; {row}")


if __name__ == "__main__":
    main()
