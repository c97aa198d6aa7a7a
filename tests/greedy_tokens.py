"""Greedy tokens and per-token compile counts for the tiny llm workloads on one backend.

Run as ``python tests/greedy_tokens.py BACKEND [WORKLOAD...]`` (default: gpt2 and llama3)
by the tests, under whichever interpreter the backend needs; prints JSON
{workload: {"tokens": [[...]], "compiles": [...]}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from tpubench.backends import get_backend
from workloads import load

PROMPT, GENERATED, BATCH = 16, 8, 2


def greedy(backend_name: str, workload: str) -> dict:
    backend = get_backend(backend_name)
    instance = load(workload, "tiny", device=backend.device(), batch_size=BATCH, seq_len=PROMPT)
    model = backend.prepare(instance.model.eval())
    tokens, compiles = [], []
    with torch.no_grad():
        for token in instance.greedy(model, PROMPT + GENERATED).tokens(GENERATED):
            backend.after_step()
            compiles.append(backend.compile_count())
            tokens.append(token.cpu())
    return {"tokens": torch.cat(tokens, dim=1).tolist(), "compiles": compiles}


if __name__ == "__main__":
    print(json.dumps({name: greedy(sys.argv[1], name) for name in sys.argv[2:] or ("gpt2", "llama3")}))
