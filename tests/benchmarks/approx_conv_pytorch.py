"""PyTorch reference for approx_conv_bench: a straightforward LUT emulation of the same
approximate convolution (quantize, unfold, gather from the 65,536-entry table, int32 sum,
dequantize) and the exact cuDNN convolution, on resnet20's 3x3 layer shapes. Prints one JSON
line per shape. The emulation runs in chunks of images so that its index tensor fits in memory.
    python3 approx_conv_pytorch.py [--batch 512] [--iters 5]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

LAYERS = [("stage1 3x3 16->16", 32, 16, 16, 1), ("stage2 3x3 16->32 s2", 32, 16, 32, 2),
          ("stage2 3x3 32->32", 16, 32, 32, 1), ("stage3 3x3 32->64 s2", 16, 32, 64, 2),
          ("stage3 3x3 64->64", 8, 64, 64, 1)]


def quant(t):
    lo, hi = t.min(), t.max()
    scale = (hi - lo) / 255
    zp = torch.clamp(torch.round(-lo / scale), 0, 255)
    codes = torch.clamp(torch.floor(t / scale + zp + 0.5), 0, 255).to(torch.int32)
    return codes, scale, zp.to(torch.int32)


def lut_conv(x, w, table, stride, chunk):
    n, c, h, wd = x.shape
    k = w.shape[0]
    a, sa, za = quant(x)
    wc, sw, zw = quant(w)
    wflat = wc.reshape(k, -1)  # [K, P]
    patch = wflat.shape[1]
    outs = []
    for i in range(0, n, chunk):
        # Padding positions carry the code of 0 (the zero point), as in the method.
        cols = F.unfold((a[i:i + chunk] - za).float(), 3, padding=1, stride=stride)
        cols = (cols.round().to(torch.int32) + za)  # [B, P, L]
        idx = (cols.unsqueeze(1) << 8) | wflat.view(1, k, patch, 1)  # [B, K, P, L]
        t_sum = table[idx.long()].sum(dim=2, dtype=torch.int32)  # [B, K, L]
        a_sum = cols.sum(dim=1, dtype=torch.int32).unsqueeze(1)
        w_sum = wflat.sum(dim=1, dtype=torch.int32).view(1, k, 1)
        acc = t_sum - zw * a_sum - za * w_sum + patch * za * zw
        outs.append(acc.float() * (sa * sw))
    return torch.cat(outs)


def timed(f, iters):
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=16)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    table = torch.randint(0, 65536, (65536,), device=dev, dtype=torch.int32)
    for name, hw, c, k, stride in LAYERS:
        x = torch.rand(args.batch, c, hw, hw, device=dev) * 2 - 1
        w = torch.rand(k, c, 3, 3, device=dev) * 2 - 1
        lut_ms = timed(lambda: lut_conv(x, w, table, stride, args.chunk), args.iters)
        xcl, wcl = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
        exact_ms = timed(lambda: F.conv2d(xcl, wcl, stride=stride, padding=1), 20)
        ho = (hw + 2 - 3) // stride + 1
        macs = args.batch * ho * ho * k * c * 9
        print(json.dumps({"impl": "pytorch", "gpu": torch.cuda.get_device_name(), "layer": name,
                          "batch": args.batch, "lut_emulation_ms": round(lut_ms, 3),
                          "lut_table_macs_per_s": float("%.4g" % (macs / (lut_ms * 1e-3))),
                          "cudnn_fp32_channels_last_ms": round(exact_ms, 4)}))


if __name__ == "__main__":
    main()
