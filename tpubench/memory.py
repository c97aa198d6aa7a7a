"""What a run's memory holds: weights, gradients, optimizer state, and the rest.

"Will it fit, and what should be sharded" needs the peak split by what holds it. Three parts
are counted exactly from the torch objects of the run: the model's parameters (and buffers),
the parameters' ``.grad`` tensors and the optimizer's state tensors, each storage once (a
tied weight, a view, FSDP2's padded shard). The fourth, activations and temporaries (the
batch included), is what the measured device peak leaves: peak - baseline - the three, with
peak and baseline as the run's ``peak_mem_bytes`` and ``baseline_mem_bytes`` define them.
It is never estimated: no peak, no figure.

Tensors on another device than the run's are not in its device peak and are not counted:
AdamW's ``step`` counters live on the host unless the optimizer is capturable or fused, so
they count on a CPU run (4 bytes each) and not on a CUDA, XLA or TorchTPU one.

Gradients exist only inside a training step (the step ends with ``zero_grad(set_to_none=True)``),
so the parts are counted in a global optimizer step post-hook: after the first step's update,
before its ``zero_grad``, when parameters, gradients and state all exist. Counting reads
shapes only (no device sync), once; later calls of the hook return at once.

Under torch_xla's SPMD the process sees one virtual device and torch_xla gives no per-device
memory; each tensor's bytes are then its per-device shard's, from its sharding annotation
(:func:`xla_shard_bytes`). XLA materialises gradients only inside the step's graph, so a
gradient without an annotation of its own counts with its parameter's (the layout the
partitioner gives it). With ``--profile-memory`` (CPU and CUDA) one more step runs under
torch.profiler's memory profile, whose categories over time are stored as the run's timeline
(:func:`profile_timeline`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpubench.warning import TpubenchWarning

if TYPE_CHECKING:
    import torch

#: the runs table's breakdown columns, by part
PART_COLUMNS = {
    "weights": "mem_weights_bytes",
    "gradients": "mem_grads_bytes",
    "optimizer": "mem_optimizer_bytes",
    "activations": "mem_activations_bytes",
}
#: ``memory_breakdown_source``: how a row's breakdown was found
COUNTED = "counted"  # parts counted from the torch objects, activations = device peak - baseline - parts
COUNTED_SHARDS = "counted_shards"  # XLA SPMD: each tensor's per-device shard; activations unknown
#: the backends whose memory torch.profiler can profile (its allocator events)
PROFILE_MEMORY_BACKENDS = ("cpu", "cuda")
#: torch.profiler's categories (``torch.profiler._memory_profiler.Category``) as stored, by name
PROFILER_CATEGORIES = {
    "PARAMETER": "parameter",
    "OPTIMIZER_STATE": "optimizer_state",
    "GRADIENT": "gradient",
    "ACTIVATION": "activation",
    "TEMPORARY": "temporary",
    "INPUT": "input",
    "AUTOGRAD_DETAIL": "autograd_detail",
    None: "unknown",
}


@dataclass(frozen=True)
class Parts:
    """Bytes of the three exactly counted parts on one device."""

    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of ``tensor``: a DTensor's local shard (FSDP2, tensor parallel), else itself."""
    return getattr(tensor, "_local_tensor", tensor)


_TILES = re.compile(r"devices=\[([\d,]+)\]")


def xla_shard_bytes(tensor: torch.Tensor, like: torch.Tensor | None = None) -> int:
    """Bytes of one device's shard of an XLA tensor, from its sharding annotation
    (``{devices=[2,1]0,1}``: dim 0 in 2 tiles; ``last_tile_dim_replicate``: the last tile dim
    replicates); the whole tensor when it is replicated or unannotated. ``like``: the tensor
    whose annotation to use when ``tensor`` has none (a gradient, by its parameter's)."""
    import torch_xla

    spec = torch_xla._XLAC._get_xla_sharding_spec(tensor)
    if not spec and like is not None:
        spec = torch_xla._XLAC._get_xla_sharding_spec(like)
    whole = tensor.numel() * tensor.element_size()
    found = _TILES.search(spec or "")
    if not found:
        return whole
    tiles = [int(n) for n in found.group(1).split(",")]
    if "last_tile_dim_replicate" in spec:
        tiles = tiles[:-1]
    if len(tiles) != tensor.dim():
        return whole
    elements = 1
    for size, parts in zip(tensor.shape, tiles, strict=True):
        elements *= -(-size // parts)  # XLA pads an uneven split: each shard is the ceiling
    return elements * tensor.element_size()


def storage_of(tensor: torch.Tensor, like: torch.Tensor | None, sharded: bool) -> tuple[Any, int]:
    """A key naming the memory ``tensor`` lives in, and its bytes: its storage's (a view
    counts its whole storage, once), or, where a tensor has no storage to read (an XLA
    tensor), the tensor itself and its bytes (per device shard when ``sharded``)."""
    tensor = local(tensor)
    if tensor.device.type == "xla":
        size = xla_shard_bytes(tensor, like) if sharded else tensor.numel() * tensor.element_size()
        return ("tensor", id(tensor)), size
    try:
        storage = tensor.untyped_storage()
        return (str(tensor.device), storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a device whose tensors expose no storage
        return ("tensor", id(tensor)), tensor.numel() * tensor.element_size()


def count_bytes(
    tensors: Iterable[tuple[torch.Tensor, torch.Tensor | None]], device_type: str, seen: set[Any], sharded: bool
) -> int:
    """Bytes of the unique storages among ``tensors`` (each with the tensor whose sharding
    it takes if it has none) that live on ``device_type``, skipping those in ``seen``."""
    total = 0
    for tensor, like in tensors:
        if local(tensor).device.type != device_type:
            continue
        key, size = storage_of(tensor, like, sharded)
        if key not in seen:
            seen.add(key)
            total += size
    return total


def count_parts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, device_type: str, sharded: bool = False
) -> Parts:
    """The weights (parameters and buffers), gradients and optimizer state of ``model`` and
    ``optimizer`` on ``device_type``, each storage once, and once across the parts (a
    storage that is a parameter is not also counted as state)."""
    import torch

    seen: set[Any] = set()
    params = list(model.parameters())
    weights = count_bytes(((t, None) for t in [*params, *model.buffers()]), device_type, seen, sharded)
    grads = count_bytes(((p.grad, p) for p in params if p.grad is not None), device_type, seen, sharded)
    state: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    if optimizer is not None:
        for param, values in optimizer.state.items():
            state += [(v, param) for v in values.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
            state += [(v, None) for v in values.values() if isinstance(v, torch.Tensor) and v.dim() == 0]
    return Parts(weights, grads, count_bytes(state, device_type, seen, sharded))


class PartsCounter:
    """Counts a run's parts once, inside its first optimizer step (see the module's doc);
    a run without an optimizer (inference) gets its weights counted by :meth:`finish`."""

    def __init__(self, model: torch.nn.Module, device_type: str, sharded: bool):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.model, self.device_type, self.sharded = model, device_type, sharded
        self.parts: Parts | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        # a hook cannot remove itself (torch iterates the hooks' dict while calling them)
        self._handle = register_optimizer_step_post_hook(self._count)

    def _count(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.parts is None:
            self.optimizer = optimizer
            self.parts = count_parts(self.model, optimizer, self.device_type, self.sharded)

    def held(self) -> dict[str, list[torch.Tensor]]:
        """The tensors that last the whole run, by the profiler category they are: the
        parameters (this rank's shards) and the optimizer's state, for
        :func:`profile_timeline` to name where the profiler cannot."""
        import torch

        state = self.optimizer.state.values() if self.optimizer is not None else []
        return {
            "PARAMETER": list(self.model.parameters()),
            "OPTIMIZER_STATE": [v for values in state for v in values.values() if isinstance(v, torch.Tensor)],
        }

    def finish(self) -> Parts:
        """The parts, counting the weights now if no optimizer step ran; removes the hook."""
        self._handle.remove()
        if self.parts is None:
            self.parts = count_parts(self.model, None, self.device_type, self.sharded)
        return self.parts


def breakdown(parts: Parts, peak: int | None, baseline: int | None, sharded: bool) -> dict[str, Any]:
    """The runs table's breakdown columns and the run's ``breakdown`` rows of the memory table.

    Activations and temporaries are the measured peak above the baseline less the counted
    parts; null without a peak (XLA SPMD), and null with a warning when the peak is below
    the parts (a peak that cannot be this run's, e.g. memory counted elsewhere).
    """
    activations = None
    if peak is not None:
        activations = peak - (baseline or 0) - parts.total
        if activations < 0:
            warnings.warn(
                f"memory breakdown: the measured peak above the baseline ({peak - (baseline or 0)} B) is below "
                f"the counted weights, gradients and optimizer state ({parts.total} B); activations left null",
                TpubenchWarning,
                stacklevel=2,
            )
            activations = None
    source = COUNTED_SHARDS if sharded else COUNTED
    values = {
        "weights": parts.weights,
        "gradients": parts.gradients,
        "optimizer": parts.optimizer,
        "activations": activations,
    }
    rows = [
        {"kind": "breakdown", "category": name, "bytes": value, "source": source}
        for name, value in {**values, "peak": peak, "baseline": baseline}.items()
    ]
    return {
        **{PART_COLUMNS[name]: value for name, value in values.items()},
        "memory_breakdown_source": source,
        "memory": rows,
    }


#: profiled steps :func:`profile_timeline` tries before torch's memory profile's error stands
PROFILE_ATTEMPTS = 3


def profile_timeline(
    step: Callable[[], Any],
    device: torch.device,
    activities: list[Any],
    synchronize: Callable[[], None],
    held: dict[str, list[torch.Tensor]] | None = None,
) -> list[dict[str, Any]]:
    """One more ``step`` under torch.profiler's memory profile: the ``timeline`` rows of the
    memory table, bytes per category at each allocation event on ``device``, times in µs
    from the step's first event. Categories that hold nothing during the step are left out.

    ``held`` (:meth:`PartsCounter.held`) names the run's lasting tensors where the profiler
    leaves them uncategorised (:func:`name_held`): an FSDP rank's parameter shards and
    optimizer state are DTensors, whose local storage the profiler does not trace back to
    the module or the optimizer, so without it they read ``unknown`` and the step has no
    optimizer-state category at all.

    torch's memory profile checks the data flow it rebuilds from the recording, and on an
    FSDP rank over gloo that check sometimes fails (``AssertionError: version mismatch``,
    in one of the first three 2-rank runs here; the cause inside torch was not found); the
    step is then profiled again, up to :data:`PROFILE_ATTEMPTS` times,
    before the run fails with it. Every rank profiles again when one must
    (:func:`every_rank`): a rank that stepped alone would wait in its collectives."""
    import torch
    from torch.profiler import profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    found, failure = None, None
    for _ in range(PROFILE_ATTEMPTS):
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            output = step()
            synchronize()
            del output
        try:
            found, failure = MemoryProfileTimeline(prof._memory_profile()), None
        except AssertionError as error:  # torch's data-flow check of one recording ("version mismatch"); see above
            found, failure = None, error
        if every_rank(found is not None, device):
            break
    if found is None:
        raise failure or RuntimeError("torch's memory profile failed on another rank")
    if device.type == "cuda" and device.index is None:  # the profile names the device by its index
        device = torch.device("cuda", torch.cuda.current_device())
    name_held(found, held or {})
    times, sizes = found._coalesce_timeline(str(device))
    if not times:
        return []
    first = min((t for t in times if t >= 0), default=0)  # -1: memory that existed before the profile
    columns = {
        PROFILER_CATEGORIES[category.name if category is not None else None]: index + 1
        for category, index in _CATEGORY_TO_INDEX.items()
    }
    held = {name: index for name, index in columns.items() if any(row[index] for row in sizes)}
    return [
        {"kind": "timeline", "t_us": float(max(t, first) - first), "category": name, "bytes": int(row[index])}
        for t, row in zip(times, sizes, strict=True)
        for name, index in held.items()
    ]


def every_rank(ok: bool, device: torch.device) -> bool:
    """Whether ``ok`` holds on every rank of the run's process group (``ok`` itself in a
    one-process run): one all-reduce of a flag, on ``device`` so that NCCL can carry it."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def name_held(found: Any, held: dict[str, list[torch.Tensor]]) -> None:
    """Give the memory that existed before the profiled step and that the profiler left
    uncategorised the category of the run's tensor it holds (``held``: the category's name
    in ``torch.profiler._memory_profiler.Category``, then the tensors; a DTensor by its
    local shard), matched by storage address. Only memory that predates the step and lasts
    through it, so no address is another allocation's; a category the profiler gave is kept."""
    from torch.profiler._memory_profiler import Action, Category, TensorKey

    owner = {}
    for name, tensors in held.items():
        for tensor in map(local, tensors):
            owner.setdefault((tensor.device, tensor.untyped_storage().data_ptr()), Category[name])
    for _, action, (key, version), _ in found.timeline:
        if action != Action.PREEXISTING or not isinstance(key, TensorKey):
            continue
        if found.categories.get(key, version) is None and (key.device, key.storage.ptr) in owner:
            found.categories.set_by_id(key, owner[key.device, key.storage.ptr])


def tpu_hbm_summary() -> str | None:
    """TorchTPU's own HBM usage summary (``torch.tpu._hbm_usage_summary()``, a private call
    of torch_tpu 0.2.0), as text for the row's backend metrics. Unverified without a chip:
    what it returns has not been seen, so it is kept as given, not parsed; None where the
    call is missing or fails."""
    import torch

    call = getattr(getattr(torch, "tpu", None), "_hbm_usage_summary", None)
    if call is None:
        return None
    try:
        return str(call())
    except Exception:  # a private call of a pre-release runtime: its failure costs only this note
        return None
