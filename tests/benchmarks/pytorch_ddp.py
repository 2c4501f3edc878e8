"""PyTorch DistributedDataParallel training throughput, the reference for Topiary's data
parallelism on the same GPUs (tests/benchmarks/dp_scaling.sh). Run under torchrun:

  torchrun --nproc_per_node N pytorch_ddp.py --model resnet50 --batch 256 --hw 224 \\
      --channels 3 --steps 30 --mode bf16_eager_cl

--batch is per GPU. Random inputs made once on each GPU (no data loading); SGD with
momentum; DDP's defaults (25 MB buckets, buffers broadcast from rank 0); --sync-bn converts
the batch norms to SyncBatchNorm. Rank 0 prints one
JSON line with the images per second of all GPUs together.
"""
import argparse, json, os, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_train_step import build  # noqa: E402  the same model definitions


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--hw", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--mode", default="bf16_eager_cl", help="eager_cl | bf16_eager_cl")
    p.add_argument("--sync-bn", action="store_true",
                   help="torch.nn.SyncBatchNorm (statistics of the global batch)")
    a = p.parse_args()
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    world = dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.backends.cudnn.benchmark = True
    model = build(a.model, a.channels, a.hw).to(dev).to(memory_format=torch.channels_last)
    if a.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randn(a.batch, a.channels, a.hw, a.hw, device=dev, generator=g)
    x = x.to(memory_format=torch.channels_last)
    y = torch.arange(a.batch, device=dev) % 10
    bf16 = a.mode.startswith("bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    s = time.perf_counter() - t0
    if rank == 0:
        engine = f"pytorch {torch.__version__} ddp {a.mode}" + (" sync_bn" if a.sync_bn else "")
        print(json.dumps({"engine": engine, "model": a.model,
                          "batch_per_gpu": a.batch, "gpus": world,
                          "images_per_s": round(a.batch * world * a.steps / s, 1),
                          "ms_per_step": round(1000 * s / a.steps, 3)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
