"""Records tests/data/gloo_fsdp2_rank0.json.gz: rank 0's torch.profiler trace of FSDP2 on two
gloo ranks (a 64-128-16 MLP, each Linear a unit, then the root; one warm-up and two traced
steps, shapes recorded as `tpubench run --profile` records them). Recorded with torch 2.13:

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 2 tests/data/record_gloo_fsdp2.py
    gzip -9 -c trace0.json > tests/data/gloo_fsdp2_rank0.json.gz
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile, schedule

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
fully_shard(model[0])
fully_shard(model[2])
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = torch.randn(8, 64).chunk(dist.get_world_size())[rank]


def export(profiler: profile) -> None:
    if rank == 0:
        profiler.export_chrome_trace(f"trace{rank}.json")


with profile(
    activities=[ProfilerActivity.CPU],
    record_shapes=True,
    schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
    on_trace_ready=export,
) as profiler:
    for _ in range(3):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        profiler.step()
dist.destroy_process_group()
