"""Records tests/data/ops_rows.json.gz: the ``ops`` rows that :func:`tpubench.traces.ingest`
gave the recorded Chrome traces here before ingest got its fast path (tpubench at b83a179,
torch 2.13.0+cpu), which tests/test_trace_counts.py holds the current code to, row by row.

tests/data/gpt2_tiny_train_cpu.json.gz is the trace of
``tpubench run --workload gpt2 --mode train --backend cpu --warmup 1 --steps 2 --profile
--profile-steps 2`` (shapes recorded), gzipped with ``gzip -9``. Run from the repository root
with that commit's tpubench first on the path:

    python tests/data/record_ops_rows.py
"""

import gzip
import json
from pathlib import Path

import torch

from tpubench.traces import ingest

DATA = Path(__file__).parent
TRACES = {"gpt2_tiny_train_cpu.json.gz": 2, "gloo_fsdp2_rank0.json.gz": 2}  # file: traced steps

rows = {name: ingest(DATA / name, steps) for name, steps in TRACES.items()}
with gzip.open(DATA / "ops_rows.json.gz", "wt") as out:
    json.dump({"torch": torch.__version__, "rows": rows}, out, indent=0, sort_keys=True)
