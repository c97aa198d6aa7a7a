"""``torch.compile`` bookkeeping shared by the compiled backends (cpu-compile, cuda-compile).

Dynamo keeps its statistics in private module-level tables; they are read defensively so
that a torch release that renames them yields a null figure, never a crash.

Inductor also keeps an on-disk cache of compiled graphs (and Triton kernels) that outlives
the process. Left alone it would make ``first_step_s`` depend on whatever the user compiled
before (about 2 s warm against 15 s cold for gpt2-tiny train on a 2-core CPU), so every
run gets a private, empty cache unless ``--compile-cache DIR`` asks for a shared one, and
the row records the cache's hits and misses either way.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from tpubench.spec import RunSpec

if TYPE_CHECKING:
    import torch

    from tpubench.compiles import Capture


def compile_count() -> int:
    """Distinct graphs Dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_seconds() -> float | None:
    """Frame compilation plus the lazily compiled backward graphs, in seconds.

    Dynamo compiles the forward when a frame is first called and AOTAutograd compiles the
    backward at the first ``backward()``, so both tables are needed.
    """
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return None
    keys = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")
    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in keys))


def use_cache_dir(compile_cache: str | None) -> None:
    """Point Inductor and Triton at ``compile_cache/inductor``, or at a fresh directory that
    is removed when the worker exits. Must run before the first compilation."""
    if compile_cache:
        directory = os.path.join(compile_cache, "inductor")
    else:
        directory = tempfile.mkdtemp(prefix="tpubench-inductor-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    os.environ["TRITON_CACHE_DIR"] = os.path.join(directory, "triton")


def cache_counters() -> dict[str, int]:
    """Inductor's FX-graph cache lookups in this process: a hit loads compiled code from disk."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {
        "compile_cache_hits": int(inductor["fxgraph_cache_hit"]),
        "compile_cache_misses": int(inductor["fxgraph_cache_miss"]),
    }


def name_kernels() -> None:
    """Have Inductor's C++ kernels record a profiler event each (a profiled run only; must run
    before the first compilation). Without it a CPU trace shows a compiled graph as one
    ``## Call CompiledFxGraph <hash> ##`` event whose fused kernels nobody can attribute;
    with it each kernel is an event named after the ops it fuses
    (``cpp_fused_add_native_layer_norm_3``), which :mod:`tpubench.analysis.categories`
    reads. Outside a profiler the events cost a flag check per kernel call."""
    from torch._inductor import config  # set here: the worker's fork server may have read the environment

    config.cpp.enable_kernel_profile = True


def compile_model(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """Compile with static shapes: a benchmark's shapes never change, so neither should graphs."""
    import torch

    return torch.compile(model, backend=backend, dynamic=False)


class InductorCompiled:
    """Mixin for a backend that runs the model through ``torch.compile`` with Inductor."""

    def setup(self, spec: RunSpec) -> None:
        super().setup(spec)  # type: ignore[misc]
        use_cache_dir(spec.compile_cache)
        if spec.profile_steps or spec.trace_attention:
            name_kernels()

    def extra_metrics(self) -> dict[str, Any]:
        return {**super().extra_metrics(), **cache_counters()}  # type: ignore[misc]

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return compile_model(model)

    def compile_capture(self, spec: RunSpec) -> Capture | None:
        from tpubench.compiles.dynamo import DynamoCapture

        return DynamoCapture(shared_cache=bool(spec.compile_cache))

    def compile_count(self) -> int:
        return compile_count()

    def compile_seconds(self) -> float | None:
        return compile_seconds()
