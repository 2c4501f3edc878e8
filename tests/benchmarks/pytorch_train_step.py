#!/usr/bin/env python3
"""PyTorch reference for train_step_bench: the same models (LeNet-5 with max pooling; the
CIFAR ResNet-20 with 1x1-conv + BN projection shortcuts), batch, input and thread count, SGD
with momentum and weight decay (fused on a GPU, PyTorch's fastest optimizer step), random
data. fp32 convolutions and matmuls use TF32 only with --tf32 (compare with Topiary's tf32;
without it, with Topiary's fp32). Prints one JSON line per model and mode."""
import argparse, json, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class LeNet5(nn.Module):
    def __init__(self, c, hw, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = ((hw // 2) - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNetCifar(nn.Module):
    def __init__(self, depth, c, classes):
        super().__init__()
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(c, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for i, w in enumerate([16, 32, 64]):
            for b in range(n):
                layers.append(Block(cin, w, 2 if (i > 0 and b == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(name, c, hw):
    if name == "lenet5":
        return LeNet5(c, hw, 10)
    if name in ("resnet18", "resnet34", "resnet50"):
        import torchvision  # ImageNet-style models: torchvision's definitions
        return getattr(torchvision.models, name)(num_classes=10)
    return ResNetCifar(int(name[len("resnet"):]), c, 10)


def run(name, a, mode, threads):
    """mode: eager | eager_cl | compile | compile_ma, each also with a bf16_ prefix (autocast)
    (cl: channels-last; compile: torch.compile's reduce-overhead mode, CUDA graphs; compile_ma:
    max-autotune-no-cudagraphs)."""
    dev = torch.device(a.device)
    cl = "_cl" in mode or "compile" in mode
    mf = torch.channels_last if cl else torch.contiguous_format
    model = build(name, a.channels, a.hw).to(dev).to(memory_format=mf)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4,
                          fused=dev.type == "cuda")
    compiled = "compile" in mode
    if compiled:
        # Forward and backward compiled (reduce-overhead: captured as CUDA graphs); the
        # optimizer's fused step eager.
        model = torch.compile(
            model, mode="max-autotune-no-cudagraphs" if mode.endswith("_ma") else "reduce-overhead")
    x = torch.randn(a.batch, a.channels, a.hw, a.hw, device=dev).to(memory_format=mf)
    y = torch.arange(a.batch, device=dev) % 10
    bf16 = mode.startswith("bf16")

    def step():
        if compiled and not mode.endswith("_ma"):
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    warmup = 10 if "compile" in mode else 3
    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    out = {"engine": "pytorch " + torch.__version__ + " " + mode + (" tf32" if a.tf32 else ""),
           "model": name,
           "batch": a.batch, "threads": threads, "images_per_s": round(a.batch * a.steps / s, 1),
           "ms_per_step": round(1000 * s / a.steps, 3)}
    if dev.type == "cuda":
        # peak_mb: tensors allocated at the peak of the timed steps. Under CUDA graphs
        # (reduce-overhead) the graphs' activations live in private pools that the allocator
        # counts as reserved, not allocated, so reserved_mb (what the caching allocator held at
        # most over the timed steps, the pools included) is the figure to compare with a
        # planned footprint.
        out["peak_mb"] = round(torch.cuda.max_memory_allocated() / 1048576, 1)
        out["reserved_mb"] = round(torch.cuda.max_memory_reserved() / 1048576, 1)
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="lenet5,resnet20")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hw", type=int, default=28)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--modes", default="eager,eager_cl")
    p.add_argument("--tf32", action="store_true", help="fp32 convolutions and matmuls in TF32")
    a = p.parse_args()
    import os
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            try:
                run(name, a, mode, threads)
            except Exception as e:  # report and go on: one failing mode must not hide the rest
                print(json.dumps({"engine": "pytorch " + mode, "model": name, "error": str(e)[:300]}),
                      flush=True)


if __name__ == "__main__":
    main()
