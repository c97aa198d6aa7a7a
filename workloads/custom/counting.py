"""What one step of a user's model costs, found by running it rather than by formula: its
FLOPs (``torch.utils.flop_counter``), the matmul-like ops the counter missed, and the peak
bytes of the tensors the step creates.

The step runs on the meta device wherever the model builds there: no memory, no time, and
SDPA decomposes into the matmuls the counter sees. The counter misses ops it has no formula
for (``torch._grouped_mm``, HF's default MoE path) and the fused CPU attention kernel
(``_scaled_dot_product_flash_attention_for_cpu``), both silently. So a dispatch mode
records every op that ran, and any matmul-like op the counter did not count is reported,
so a row can say its FLOPs are incomplete instead of giving a wrong MFU.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

#: op names whose work is matrix products: an op matching this that ran but counted 0 FLOPs
#: means the count is incomplete (elementwise ops are uncounted by convention, not missed)
MATMUL_LIKE = re.compile(r"(?:^|_)(?:[a-z]*mm|matmul|einsum|linear|[a-z]*conv[a-z0-9]*|[a-z]*attention)(?:_|$)")


class StepRecorder(TorchDispatchMode):
    """Every aten op a step dispatches, and the peak bytes of the tensors it created and kept.

    A tensor's bytes count from the op that made it until it is freed (a weakref finaliser).
    Views and in-place results share an existing tensor's storage, so they add nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func.overloadpacket))
        inputs = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and id(tensor) not in inputs and not tensor._is_view():
                size = tensor.numel() * tensor.element_size()
                self.live_bytes += size
                weakref.finalize(tensor, self._free, size)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _free(self, size: int) -> None:
        self.live_bytes -= size


#: ops only a step with attention runs: a fused attention kernel, or the softmax of the scores
#: (SDPA's math path, as it runs on meta, emits ``_safe_softmax``; eager attention ``_softmax``)
ATTENTION_OPS = re.compile(r"attention|^_?(?:safe_)?softmax$")  # not _log_softmax: a classifier's loss


@dataclass(frozen=True)
class StepCount:
    """One step's counted FLOPs, the matmul-like ops counted as 0, its peak new bytes, and
    whether it ran attention."""

    flops: float
    incomplete: tuple[str, ...]
    peak_bytes: int
    attention: bool


def count_step(step: Callable[[], Any]) -> StepCount:
    """Run ``step`` under the flop counter and the recorder (on whatever device its tensors are)."""
    recorder = StepRecorder()
    with FlopCounterMode(display=False) as counter, recorder:
        step()
    counted = {str(op) for op, flops in counter.get_flop_counts().get("Global", {}).items() if flops}
    missed = sorted(op for op in recorder.ops if MATMUL_LIKE.search(op.split(".")[-1]) and op not in counted)
    attention = any(ATTENTION_OPS.search(op.split(".")[-1]) for op in recorder.ops)
    return StepCount(float(counter.get_total_flops()), tuple(missed), recorder.peak_bytes, attention)
