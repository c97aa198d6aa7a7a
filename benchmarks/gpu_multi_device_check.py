"""The multi-device GPU check, for a lent NVIDIA machine: NCCL under FSDP2 through
tpubench's trace readers.

One GPU is enough: torchrun starts one rank per GPU, which initialises NCCL, shards
gpt2/124m with FSDP2 as tpubench's fsdp plan does (:func:`tpubench.parallel.dtensor.fully_shard`:
each unit of the workload's ``ParallelPlan``, then the root), traces a few training steps with
torch.profiler (CPU and CUDA, shapes recorded, as ``tpubench run --profile`` does), and
reads rank 0's trace back through :func:`tpubench.traces.ingest` and
:func:`tpubench.traces.collectives.columns`. It prints, and writes to ``--out`` as
``summary.json`` with the trace gzipped:

- every NCCL kernel row and its category, which must be ``collective`` (the check fails if
  one is not);
- the collective rows' ``comm_bytes`` and ``busbw_gbps``;
- the run's ``collective_ms``, ``exposed_collective_ms`` and their shares of the step.

    torchrun --standalone --nproc-per-node 1 benchmarks/gpu_multi_device_check.py --out "$OUT"
    torchrun --standalone --nproc-per-node 8 benchmarks/gpu_multi_device_check.py --out "$OUT"  # 8 GPUs

With one rank NCCL may move data without a kernel of its own (a one-rank communicator can
copy instead of communicating); the check then says so and exits 3 rather than passing on
nothing. Exit 0: NCCL kernels seen and all categorised as collective; 1: one was not.
Written for the device machine; it cannot run on a host without a GPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # as the tpubench command: no TPU plugin here

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_NCCL_KERNEL = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for summary.json and the trace.")
    parser.add_argument("--workload", default="gpt2")
    parser.add_argument("--size", default="124m")
    parser.add_argument("--batch-per-rank", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10, help="Timed steps after 3 warm-up steps.")
    parser.add_argument("--profile-steps", type=int, default=3)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    from tpubench.measure import make_step
    from tpubench.parallel.dtensor import fully_shard
    from tpubench.traces import ingest
    from tpubench.traces.collectives import columns
    from workloads import get_workload
    from workloads.base import Shape, build

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    workload = get_workload(args.workload)
    shape = Shape(args.batch_per_rank, seq_len=args.seq_len)  # this rank's slice of the global batch
    torch.manual_seed(rank)
    instance = build(workload, args.size, device=f"cuda:{local_rank}", dtype=torch.bfloat16, shape=shape)
    # FSDP2 as tpubench's fsdp plan applies it: each of the plan's units, then the root
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
    fully_shard(instance.model, workload.parallel, mesh)
    step = make_step(instance, instance.model, "train")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    step_ms = statistics.median(times)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / f"trace-rank{rank}.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as profiler:
        for _ in range(args.profile_steps):
            step()
        torch.cuda.synchronize()
    profiler.export_chrome_trace(str(trace))
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return 0

    rows = ingest(trace, args.profile_steps, devices=world)
    nccl = [row for row in rows if row["source"] == "kernel" and row["op"].lower().startswith("nccl")]
    wrong = [row["op"] for row in nccl if row["category"] != "collective"]
    summary = {
        "world": world,
        "device": torch.cuda.get_device_name(local_rank),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "fsdp_units": len(plan.modules(instance.model, plan.fsdp_units)) if (plan := workload.parallel) else 0,
        "median_step_ms": step_ms,
        "nccl_kernels": [
            {key: row.get(key) for key in ("op", "category", "calls", "self_us_per_step", "comm_bytes", "busbw_gbps")}
            for row in nccl
        ],
        "collective_rows": [
            {key: row.get(key) for key in ("source", "op", "calls", "self_us_per_step", "comm_bytes", "busbw_gbps")}
            for row in rows
            if row["category"] == "collective"
        ],
        "not_collective": wrong,
        **columns(trace, args.profile_steps, world, step_ms),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    with open(trace, "rb") as source, gzip.open(args.out / f"{trace.name}.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    trace.unlink()
    print(json.dumps(summary, indent=1))
    if wrong:
        print(f"FAIL: NCCL kernels not categorised as collective: {wrong}")
        return 1
    if not nccl:
        print(f"INCONCLUSIVE: no NCCL kernel in the trace of {world} rank(s); NCCL moved the data without one")
        return NO_NCCL_KERNEL
    print(f"OK: {len(nccl)} NCCL kernel row(s), all collective")
    return 0


if __name__ == "__main__":
    sys.exit(main())
