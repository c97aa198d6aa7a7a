"""What one run is: the unit the runner isolates in a worker process and stores as a row."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from tpubench.precision import choices

DTYPES = ("float32", "bfloat16")
#: a step's named input dimensions (``workloads.base.DIMENSIONS``; torch-free here) and
#: the letter a shape label gives each: b8xs128 (tokens), b8xi224 (pixels), b8xl32 (latent)
DIMENSIONS = {"seq_len": "s", "image_size": "i", "latent_size": "l"}
#: the fields that identify a run for ``--resume``: also columns of the runs table
KEY_FIELDS = (
    "workload",
    "size",
    "backend",
    "mode",
    "dtype",
    "precision",
    "batch_size",
    *DIMENSIONS,
    "gen_len",
    "model_hash",
    "devices",
    "parallel",
    "tp_size",
    "scaling",
    "hosts",
    "attention",
)
#: how a run splits over its devices (``--parallel``); ``none`` is one device
PARALLEL_CHOICES = ("none", "dp", "fsdp", "tp", "fsdp_tp")
SCALING_CHOICES = ("weak", "strong")
#: the attention kernel a run forces (``--attention``): ``auto`` lets the backend choose, as
#: every run before the option did (a stored row without the column reads as ``auto``); the
#: SDPA backends on CUDA, flex attention under compile, a chip's own flash kernel (docs/long-context.md)
ATTENTION_CHOICES = ("auto", "flash", "efficient", "math", "flex", "cudnn")
ATTENTION_DEFAULT = "auto"


def parallel_label(parallel: Any, devices: Any, tp_size: Any, hosts: Any = 1) -> str:
    """``dp4``, ``fsdp8``, ``tp4``, ``fsdp4xtp2``, ``dp2 on 2 hosts``: a run's plan and its
    degrees (``devices`` the total over the hosts), then the hosts where there are several,
    from a spec or a stored row (whose numbers may load as floats); "" for a run on one host
    with no plan. A 1-device run started under a plan names it (``fsdp1``): it is a
    configuration of its own (:mod:`tpubench.analysis.identity`)."""
    plan = ""
    if isinstance(parallel, str) and parallel != "none":
        devices, tp = int(devices), int(tp_size or 1)
        plan = f"fsdp{devices // tp}xtp{tp}" if parallel == "fsdp_tp" else f"{parallel}{devices}"
    return " ".join(part for part in (plan, hosts_label(hosts)) if part)


def hosts_label(hosts: Any) -> str:
    """``on 2 hosts`` for a run over several hosts; "" for one (a row from before ``--hosts``
    holds none: it ran on one)."""
    try:
        count = int(hosts)
    except (TypeError, ValueError):  # None, NaN or pandas' NA: a row from before --hosts
        count = 1
    return f"on {count} hosts" if count > 1 else ""


def shape_label(batch_size: int, dims: dict[str, int | None], gen_len: int | None = 0, *, prefix: str = "b") -> str:
    """``b8xs128+g16``, ``b8xi224``: the batch, each set dimension by its letter, the
    generation. ``prefix=""`` gives the compact form tables use: ``8x128+16`` for tokens
    (the form stored rows have always been shown in), ``8xi224`` for images."""
    parts = [f"{prefix}{int(batch_size)}"]  # a stored row's ints may come back as floats
    for name, letter in DIMENSIONS.items():
        value = dims.get(name)
        if value is not None and value == value:  # NaN: a column the row's workload does not take
            parts.append(f"{letter if prefix or name != 'seq_len' else ''}{int(value)}")
    gen = f"+{'g' if prefix else ''}{int(gen_len)}" if gen_len and gen_len == gen_len else ""
    return "x".join(parts) + gen


def model_label(workload: str, size: str, model_hash: Any = None) -> str:
    """A run's model in words, as every label shows it: ``gpt2/tiny``; a user's model (one
    with a ``model_hash``) by its workload alone, which names its task and the config that
    differs from the defaults (``bench_mine:make_model(hidden=128)``), its one size being
    ``default``. Rows from before stored the file's path: it is shown by its stem."""
    if not isinstance(model_hash, str) or not model_hash:
        return f"{workload}/{size}"
    module, _, function = workload.rpartition(":")
    if workload.startswith("hf:/"):
        return f"hf:{PurePath(workload[3:]).name}"
    if not workload.startswith("hf:") and (module.endswith(".py") or "/" in module):
        return f"{PurePath(module).stem}:{function}"
    return workload


@dataclass(frozen=True)
class RunSpec:
    """One (workload, size, backend, mode, dtype, shape) measurement and its settings.

    The shape is the batch and the dimensions the workload takes; the others stay None.
    """

    suite: str
    workload: str
    size: str
    backend: str
    mode: str
    dtype: str
    batch_size: int  # the global batch: what one step consumes over all devices
    seq_len: int | None = None  # text; for prefill and decode: the prompt length
    image_size: int | None = None  # vision: pixels per side
    latent_size: int | None = None  # diffusion: latent pixels per side
    gen_len: int = 0  # decode: output tokens per sequence, the prefill's first token included
    warmup: int = 3
    steps: int = 10
    timeout_s: float = 600.0
    max_warmup: int = 50  # warm-up gives up waiting for the compile count to settle after this
    profile_steps: int = 0  # extra traced steps after the measured ones (0: no trace)
    profile_memory: bool = False  # one more step under torch.profiler's memory profile (cpu, cuda)
    trace_dir: str | None = None  # where the trace goes: <results>/traces/<run_id>
    compile_cache: str | None = None  # persistent compilation cache directory
    tpu_eager_mode: str | None = None  # TorchTPU eager mode (tpu backends only)
    verify: bool = False  # also compare outputs with a CPU float32 reference (tpubench.verify)
    init_dtype: str | None = None  # the dtype weights are drawn in, if not ``dtype`` (--verify's reference)
    #: a user's model (``--model``, ``tpubench.bench``): its ``ModelRef`` as JSON, resolved
    #: again in the worker; None for a registered workload, found by name
    model_ref: str | None = None
    #: its hash (config or factory source) as the main process found it when planning, so that
    #: ``--resume`` and ``ci``'s sizing never take a changed model for its old self
    model_hash: str | None = None
    capture_compiles: bool = True  # record the compiles table (tpubench/compiles/); off to measure its cost
    fail_on_recompile: bool = False  # a compile after warm-up fails the run, with its cause and line
    devices: int = 1  # devices the run uses (--devices): GPUs, PJRT devices, TorchTPU ranks
    parallel: str = "none"  # the math: none, dp, fsdp, tp, fsdp_tp (tpubench.parallel)
    tp_size: int = 1  # tensor-parallel degree: devices for tp, --tp for fsdp_tp, else 1
    #: weak (the per-device batch stays, the global batch grows with the data-parallel degree)
    #: or strong (the global batch stays); None for a one-device run with no parallel plan
    scaling: str | None = None
    #: hosts the run spans (--hosts): ``devices`` is the total, each host drives devices / hosts
    hosts: int = 1
    #: on several hosts, this host's index (0 writes the row) and where host 0's rendezvous
    #: store listens, ``HOST:PORT`` (tpubench.parallel.hosts); host-specific, not the run's identity
    node_rank: int = 0
    master: str | None = None
    #: how long the hosts wait for each other to join before the run fails (None: half the timeout)
    join_timeout_s: float | None = None
    #: the attention kernel forced (:data:`ATTENTION_CHOICES`)
    attention: str = ATTENTION_DEFAULT
    #: trace one more step, after the measured ones, for the kernel that ran and attention's share
    #: of the step (``--attention`` given); a run traced anyway (``profile_steps``) reads its trace
    trace_attention: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    #: what the matmuls compute in (``--precision``, :mod:`tpubench.precision.choices`): None
    #: reads as the dtype's plain one (bf16, fp32); a converted one needs its base dtype
    precision: str | None = None

    def __post_init__(self) -> None:
        if self.precision is None:
            object.__setattr__(self, "precision", choices.plain(self.dtype))
        elif (base := choices.resolve(self.precision, None)[1]) != self.dtype:
            raise ValueError(f"precision {self.precision} computes in {base}, not {self.dtype}")

    def key(self) -> tuple:
        """The identity ``--resume`` matches on (settings that change the measurement)."""
        return tuple(getattr(self, name) for name in KEY_FIELDS)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        return cls(**data)

    def dims(self) -> dict[str, int]:
        """The named dimensions that are set (``workloads.Shape.dims``)."""
        return {name: getattr(self, name) for name in DIMENSIONS if getattr(self, name) is not None}

    def label(self) -> str:
        """``gpt2/tiny cpu infer bfloat16 int8-wo b8xs128``: the precision named where it is not
        the dtype's plain one."""
        shape = shape_label(self.batch_size, self.dims(), self.gen_len)
        numbers = " ".join(part for part in (self.dtype, choices.label(self.precision, self.dtype)) if part)
        label = (
            f"{model_label(self.workload, self.size, self.model_hash or self.model_ref)} "
            f"{self.backend} {self.mode} {numbers} {shape}"
        )
        layout = self.parallel_label()
        label = f"{label} {layout}" if layout else label
        return f"{label} {self.attention} attention" if self.attention != "auto" else label

    def parallel_label(self) -> str:
        """``dp4``, ``fsdp8``, ``tp4``, ``fsdp4xtp2``, ``dp2 on 2 hosts``: the plan, its degrees
        and the hosts, as every reader of the store writes them (:func:`parallel_label`)."""
        return parallel_label(self.parallel, self.devices, self.tp_size, self.hosts)
