"""What one run is: the unit the runner isolates in a worker process and stores as a row."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field

DTYPES = ("float32", "bfloat16")
#: the fields that identify a run for ``--resume``: also columns of the runs table
KEY_FIELDS = ("workload", "size", "backend", "mode", "dtype", "batch_size", "seq_len", "gen_len")


@dataclass(frozen=True)
class RunSpec:
    """One (workload, size, backend, mode, dtype, batch, seq) measurement and its settings."""

    suite: str
    workload: str
    size: str
    backend: str
    mode: str
    dtype: str
    batch_size: int
    seq_len: int  # for prefill and decode: the prompt length
    gen_len: int = 0  # decode: output tokens per sequence, the prefill's first token included
    warmup: int = 3
    steps: int = 10
    timeout_s: float = 600.0
    max_warmup: int = 50  # warm-up gives up waiting for the compile count to settle after this
    profile_steps: int = 0  # extra traced steps after the measured ones (0: no trace)
    trace_dir: str | None = None  # where the trace goes: <results>/traces/<run_id>
    compile_cache: str | None = None  # persistent compilation cache directory
    tpu_eager_mode: str | None = None  # TorchTPU eager mode (tpu backends only)
    verify: bool = False  # also compare outputs with a CPU float32 reference (tpubench.verify)
    init_dtype: str | None = None  # the dtype weights are drawn in, if not ``dtype`` (--verify's reference)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def key(self) -> tuple:
        """The identity ``--resume`` matches on (settings that change the measurement)."""
        return tuple(getattr(self, name) for name in KEY_FIELDS)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        return cls(**data)

    def label(self) -> str:
        shape = f"b{self.batch_size}xs{self.seq_len}" + (f"+g{self.gen_len}" if self.gen_len else "")
        return f"{self.workload}/{self.size} {self.backend} {self.mode} {self.dtype} {shape}"
