"""gpt2 and llama3 with tensor-parallel plans, for the multi-device tests.

``gpt2-planned`` and ``llama3-planned`` are the registry's gpt2 and llama3 with their own
``ParallelPlan`` where they have one, else the plan below, written for the models as they
are on this branch: gpt2's attention still has one fused ``qkv``, which SPMD may split
column-wise (the partitioner reshards around the head reshape) though DTensor may not.
Registered through ``TPUBENCH_WORKLOAD_MODULES=parallel_workloads`` so that workers see them.
"""

from __future__ import annotations

from dataclasses import replace

from workloads import ParallelPlan, Workload
from workloads.llm import gpt2, llama3

GPT2_PLAN = ParallelPlan(
    fsdp_units=("blocks.*",),
    tp={
        "blocks.*.qkv": "colwise",
        "blocks.*.proj": "rowwise",
        "blocks.*.mlp.0": "colwise",
        "blocks.*.mlp.2": "rowwise",
    },
    tp_divides=("n_head", "d_ff"),
)
LLAMA3_PLAN = ParallelPlan(
    fsdp_units=("blocks.*",),
    tp={
        **dict.fromkeys(("blocks.*.attention.q", "blocks.*.attention.k", "blocks.*.attention.v"), "colwise"),
        "blocks.*.attention.o": "rowwise",
        **dict.fromkeys(("blocks.*.ffn.gate", "blocks.*.ffn.up"), "colwise"),
        "blocks.*.ffn.down": "rowwise",
    },
    tp_divides=("n_head", "kv_heads", "d_ff"),
)


def planned(workload: Workload, plan: ParallelPlan) -> Workload:
    return replace(
        workload, name=f"{workload.name}-planned", suites=("test-parallel",), parallel=workload.parallel or plan
    )


WORKLOADS = (planned(gpt2.WORKLOAD, GPT2_PLAN), planned(llama3.WORKLOAD, LLAMA3_PLAN))
