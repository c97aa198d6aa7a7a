"""What a workload declares, and the device-free pieces every backend builds on.

A workload never knows which chip it runs on: it builds a module and a seeded synthetic
batch on whatever ``device`` it is handed, and says how many FLOPs one step costs. The
backends (``tpubench.backends``) decide everything device-specific.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

MODES = ("train", "infer")
GENERATION_MODES = ("prefill", "decode")  # serving-style: the prompt pass, then token by token
DEVICE_KINDS = ("cpu", "cuda", "tpu")

Batch = dict[str, torch.Tensor]


#: what a memory estimate does not itemise: the allocator's fragmentation and temporaries
ALLOCATOR_HEADROOM = 1.15
#: what a run adds whatever the model's size, besides its tensors: the first use of autograd,
#: the optimizer and the math libraries (kernels' code, allocator arenas), and the worker's own
#: imports after its baseline. Tiny models (under 600k parameters) run through tpubench added
#: up to 160 MiB in training and 75 MiB in inference. One allowance for every workload:
#: :meth:`Workload.memory_bytes` adds it to the workload's estimate of its tensors.
RUNTIME_BYTES = {"train": 192 * 2**20, "infer": 128 * 2**20}


def runtime_bytes(mode: str) -> int:
    """The runtime allowance of a run in ``mode`` (prefill and decode are inference)."""
    return RUNTIME_BYTES["train" if mode == "train" else "infer"]


#: the named dimensions a step's input can have besides its batch, in the order labels show them
DIMENSIONS = ("seq_len", "image_size", "latent_size")


@dataclass(frozen=True)
class Shape:
    """One step's input: the batch and the workload's named dimensions.

    A workload takes only some dimensions (``Workload.dims``); the others stay None, so a
    stored row says which kind of input it measured (tokens, pixels or latent pixels).
    """

    batch_size: int
    seq_len: int | None = None  # text: tokens per sequence (prefill/decode: the prompt)
    image_size: int | None = None  # vision: pixels per side of a square image
    latent_size: int | None = None  # diffusion: latent pixels per side (a 256 px image -> 32)

    def dims(self) -> dict[str, int]:
        """The named dimensions that are set, without ``batch_size``."""
        return {name: getattr(self, name) for name in DIMENSIONS if getattr(self, name) is not None}


@dataclass(frozen=True)
class Published:
    """A published parameter count for one size, and where it comes from."""

    params: int  # unique parameter elements (tied or shared tensors once)
    source: str  # e.g. "He et al. 2015; torchvision resnet50 (25,557,032)"
    active_params: int | None = None  # MoE: parameters touched per token


@dataclass(frozen=True)
class Generation:
    """How a workload generates text greedily with a static cache (prefill and decode modes).

    ``allocate_cache(config, batch, length, device, dtype)`` makes the cache;
    ``prefill(model, batch, cache)`` returns the first token; ``decode(model, token,
    position, cache)`` returns the next one and advances ``position`` (a device tensor) in
    place. ``cached_flops(config, batch, new_tokens, cache_len)`` gives the FLOPs of one
    forward of ``new_tokens`` tokens attending over a cache of ``cache_len`` positions (a
    decode step, or a prefill into the cache); ``decode_bytes(config, batch, cache_len,
    dtype)`` the bytes a decode step must read.
    """

    allocate_cache: Callable[[Any, int, int, torch.device, torch.dtype], Any]
    prefill: Callable[[nn.Module, Batch, Any], torch.Tensor]
    decode: Callable[[nn.Module, torch.Tensor, torch.Tensor, Any], torch.Tensor]
    cached_flops: Callable[[Any, int, int, int], float]
    decode_bytes: Callable[[Any, int, int, torch.dtype], float]


@dataclass(frozen=True)
class ParallelPlan:
    """How a workload splits over devices, as data (torchprime's sharding configs).

    Names are globs over ``model.named_modules()`` names (``blocks.*.attention.q``), matched
    one dotted segment at a time (:meth:`matches`): ``blocks.*`` is each block, not every
    module inside one.
    ``fsdp_units`` are wrapped one by one before the root (FSDP2's ``fully_shard`` per unit;
    on XLA SPMD each unit's weights are sharded on the fsdp axis). ``tp`` maps each
    ``nn.Linear`` to ``colwise`` (output features split) or ``rowwise`` (input features
    split): DTensor's ``ColwiseParallel``/``RowwiseParallel`` on the process backends, and
    the partition specs ``("tp", ...)``/``(..., "tp")`` on XLA, so every backend computes
    the same thing. ``tp_divides`` names the config attributes a tensor-parallel degree
    must divide (heads, KV heads, the MLP width), checked before anything runs.
    """

    fsdp_units: tuple[str, ...] = ()
    tp: Mapping[str, str] = field(default_factory=dict)
    tp_divides: tuple[str, ...] = ()
    #: ``(config, tp) -> config``: the dimensions of one tensor-parallel rank's shard (its
    #: share of the heads and widths), for what is allocated outside the model at those
    #: dimensions: a generation's KV cache holds only the rank's heads. None: the config itself
    tp_local: Callable[[Any, int], Any] | None = None

    @staticmethod
    def matches(name: str, pattern: str) -> bool:
        """Whether module ``name`` matches ``pattern``: as many dotted segments, each an
        ``fnmatch`` glob (plain ``fnmatch`` would let ``*`` run across dots)."""
        names, patterns = name.split("."), pattern.split(".")
        return len(names) == len(patterns) and all(map(fnmatch.fnmatchcase, names, patterns))

    def modules(self, model: nn.Module, patterns: Iterable[str]) -> list[tuple[str, nn.Module]]:
        """``model``'s modules that match any of ``patterns``, in the model's order."""
        patterns = tuple(patterns)
        return [(name, m) for name, m in model.named_modules() if any(self.matches(name, p) for p in patterns)]

    def local_config(self, config: Any, tp: int) -> Any:
        """``config`` as a rank of a ``tp``-way tensor-parallel run holds it."""
        return config if tp == 1 or self.tp_local is None else self.tp_local(config, tp)


@dataclass(frozen=True)
class Workload:
    """One benchmark model, declared once for every backend (TorchBench's ``Model`` idea).

    ``sizes`` maps a size name (``tiny``, ``124m``...) to the config object that
    ``build_model`` takes. ``loss`` runs the model on a batch and returns a scalar loss;
    ``forward`` runs inference. ``flops`` is the analytic count for one step (2 FLOPs per
    multiply-add, train = 3 x forward, attention over the full S x S), checked against
    ``torch.utils.flop_counter`` on the meta device in the tests. ``make_batch``, ``flops``
    and ``estimate_memory_bytes`` take a :class:`Shape` holding the dimensions in ``dims``.
    ``estimate_memory_bytes`` counts the tensors a run holds at its peak;
    :meth:`memory_bytes` adds the runtime's allowance, the same for every workload.

    ``suites`` are tags, the first the primary one (stored with each row); ``size_suites``
    adds tags to single sizes (``{"8b": ("mlperf",)}``: the sizes matching an MLPerf
    reference model). ``published`` holds the published parameter count of real sizes.
    """

    name: str
    suites: tuple[str, ...]
    family: str
    description: str
    sizes: Mapping[str, Any]
    default_size: str
    default_shape: Mapping[str, Shape]
    build_model: Callable[[Any], nn.Module]
    make_batch: Callable[[Any, Shape, torch.Generator], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    forward: Callable[[nn.Module, Batch], Any]
    flops: Callable[[Any, Shape, str], float]
    estimate_memory_bytes: Callable[[Any, Shape, str, torch.dtype], int]
    dims: tuple[str, ...] = ("seq_len",)
    modes: tuple[str, ...] = MODES
    max_seq_len: Callable[[Any], int] = field(default=lambda config: 2**31)
    generation: Generation | None = None
    published: Mapping[str, Published] = field(default_factory=dict)
    size_suites: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    active_params: Callable[[Any], int] | None = None  # MoE: parameters active per token
    #: why a size cannot take a shape (None: it can), asked when runs are planned, so a
    #: shape a model cannot take is bad input before anything runs, not a failed row
    shape_error: Callable[[Any, Shape], str | None] = field(default=lambda config, shape: None)
    #: extra row columns (config, shape, mode) -> {column: value}: a user's model says what it is
    #: (``model_ref``, ``model_hash``) and how its FLOPs and loss were obtained (workloads.custom)
    row_columns: Callable[[Any, Shape, str], dict[str, Any]] | None = None
    #: batch size of each step in order (the first step's first), the last one repeated; empty:
    #: every step takes the run's batch. For test workloads that change shape on purpose, to
    #: check what a run records about recompiles (tests/compile_workloads.py)
    batch_schedule: tuple[int, ...] = ()
    #: how it splits over devices (``--parallel``); None: one device, or data parallel only
    parallel: ParallelPlan | None = None
    #: whether its step has attention, whose FLOP convention a row's ``attention_flops`` states
    #: (null for a model without: a CNN's rows have no attention to count either way)
    attention: bool = True

    @property
    def suite(self) -> str:
        """The primary suite, the one a row stores."""
        return self.suites[0]

    def suites_of(self, size: str) -> tuple[str, ...]:
        """Every suite ``size`` belongs to: the workload's, then the size's own."""
        return self.suites + tuple(s for s in self.size_suites.get(size, ()) if s not in self.suites)

    def memory_bytes(self, config: Any, shape: Shape, mode: str, dtype: torch.dtype) -> int:
        """What a run adds to its device at its peak: its tensors by the workload's estimate,
        and the runtime's allowance (:data:`RUNTIME_BYTES`)."""
        return self.estimate_memory_bytes(config, shape, mode, dtype) + runtime_bytes(mode)

    def config(self, size: str) -> Any:
        if size not in self.sizes:
            raise KeyError(f"unknown size {size!r} for workload {self.name!r}; valid: {', '.join(self.sizes)}")
        return self.sizes[size]

    def shape_for(self, device_kind: str) -> Shape:
        return self.default_shape.get(device_kind, self.default_shape["cpu"])

    def shape(self, device_kind: str, batch_size: int | None = None, **dims: int | None) -> Shape:
        """The device kind's default shape with the given overrides (None keeps the default).

        A dimension this workload does not take is a ValueError, never silently ignored.
        """
        default = self.shape_for(device_kind)
        given = {name: value for name, value in dims.items() if value is not None}
        if unknown := [name for name in given if name not in self.dims]:
            takes = ", ".join(self.dims) or "no dimension but the batch"
            raise ValueError(f"workload {self.name!r} takes {takes}, not {', '.join(unknown)}")
        return replace(default, batch_size=batch_size or default.batch_size, **given)


@dataclass
class Instance:
    """A built workload: the model and its synthetic batch, ready to step."""

    workload: Workload
    size: str
    model: nn.Module
    batch: Batch
    shape: Shape  # this process's share: a data-parallel rank holds a slice of the global batch
    tp_size: int = 1  # the tensor-parallel degree its model is split over (tpubench.parallel)

    @property
    def batch_size(self) -> int:
        return self.shape.batch_size

    @property
    def seq_len(self) -> int | None:
        return self.shape.seq_len

    def loss(self) -> torch.Tensor:
        return self.workload.loss(self.model, self.batch)

    def forward(self) -> Any:
        return self.workload.forward(self.model, self.batch)

    def greedy(self, model: nn.Module, length: int) -> Greedy:
        """A greedy generator for this instance's prompt through ``model`` (the instance's own
        model or a backend's wrapper of it), with a cache of ``length`` positions."""
        generation = self.workload.generation
        if generation is None:
            raise ValueError(f"workload {self.workload.name!r} cannot generate (no prefill/decode modes)")
        device = self.batch["input_ids"].device
        dtype = next(self.model.parameters()).dtype
        config = self.workload.config(self.size)
        if self.workload.parallel is not None:  # a tensor-parallel rank caches its own heads only
            config = self.workload.parallel.local_config(config, self.tp_size)
        cache = generation.allocate_cache(config, self.batch_size, length, device, dtype)
        position = torch.full((1,), self.seq_len, dtype=torch.long, device=device)
        return Greedy(generation, model, self.batch, cache, position)


@dataclass
class Greedy:
    """Static-cache greedy generation from one prompt, the one loop every caller shares.

    The cache and the position tensor are allocated once and reused: each generation
    overwrites the positions it reads, so repeated generations have the same shapes and
    a compiled backend never sees a new graph. The steps are separate methods because
    the timed loop (``tpubench.measure``) brackets each one with the backend's timer;
    :meth:`tokens` is for untimed callers. Call under ``torch.no_grad()``.
    """

    generation: Generation
    model: nn.Module
    prompt: Batch
    cache: Any
    position: torch.Tensor  # the next decode position, on the device, advanced in place

    def reset(self) -> None:
        """Rewind to just after the prompt, for the next generation."""
        self.position.fill_(self.prompt["input_ids"].shape[1])

    def prefill(self) -> torch.Tensor:
        """The prompt pass: fills the cache and returns the first token (B, 1)."""
        return self.generation.prefill(self.model, self.prompt, self.cache)

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step from ``token``: returns the next token (B, 1)."""
        return self.generation.decode(self.model, token, self.position, self.cache)

    def tokens(self, count: int) -> Iterator[torch.Tensor]:
        """Yield ``count`` tokens of a fresh generation, the prefill's first token included."""
        self.reset()
        token = self.prefill()
        yield token
        for _ in range(count - 1):
            token = self.decode(token)
            yield token


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Make ``dtype`` the dtype new floating-point parameters are created in, for a block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


#: the seed every run's weights and synthetic data are drawn from (stored as ``runs.seed``)
SEED = 0


def build(
    workload: Workload,
    size: str | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    shape: Shape | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    image_size: int | None = None,
    latent_size: int | None = None,
    seed: int = SEED,
    init_dtype: torch.dtype | None = None,
) -> Instance:
    """Build ``workload`` at ``size`` on ``device``: random weights, seeded synthetic data.

    The shape is ``shape``, else the device kind's default with any of ``batch_size``,
    ``seq_len``, ``image_size``, ``latent_size`` overriding it. The model is built on the
    CPU from a fixed seed and then moved, so every backend starts from bit-identical
    weights and inputs. Weights are created and drawn directly in ``init_dtype`` (default:
    ``dtype``) and then cast to ``dtype``: building in float32 and casting afterwards
    would make an 8B bfloat16 model peak at three times its size. ``--verify``'s float32
    reference passes the candidate's dtype as ``init_dtype``, so it computes with exactly
    the candidate's weights.
    """
    size = size or workload.default_size
    config = workload.config(size)
    device = torch.device(device)
    if shape is None:
        kind = device.type if device.type in DEVICE_KINDS else "tpu"
        overrides = {"seq_len": seq_len, "image_size": image_size, "latent_size": latent_size}
        shape = workload.shape(kind, batch_size, **overrides)
    if shape.seq_len is not None and shape.seq_len > workload.max_seq_len(config):
        raise ValueError(
            f"seq_len {shape.seq_len} exceeds {workload.name}/{size}'s context of {workload.max_seq_len(config)}"
        )
    torch.manual_seed(seed)
    with default_dtype(init_dtype or dtype):
        model = workload.build_model(config)
    model = model.to(dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    batch = workload.make_batch(config, shape, generator)
    return Instance(
        workload=workload,
        size=size,
        model=to_device(model, device),
        batch={k: v.to(device) for k, v in batch.items()},
        shape=shape,
    )


def to_device(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)``, keeping tied parameters tied.

    ``Module.to`` gives each module its own new ``Parameter`` wherever the tensor type
    changes (a CPU tensor becoming an XLA one), so a tied LM head came out of the move as a
    second matrix: on ``xla`` gpt2 tiny had one parameter more than on the CPU (1,052,160
    elements against 790,016), and training updated two matrices where the model has one.
    Swapping each parameter's contents in place instead keeps every ``Parameter`` object,
    so a tie (one object held by two modules) survives, and a shared tensor moves once.
    """
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return model.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
