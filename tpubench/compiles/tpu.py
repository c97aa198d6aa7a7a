"""TorchTPU's compiles, from its cache counters (tpu, tpu-compile).

TorchTPU 0.2.0 exposes counters, not causes: ``torch.tpu._get_cache_stats()`` gives the
executables compiled (``num_compilations``) and the cache lookups and hits. Per-step
deltas of ``num_compilations`` become ``compile`` rows (layer ``tpu``, cause ``unknown``).
Written from reading the torch_tpu 0.2.0 wheel, not run on a chip: whether a disk
(tier-2/3) hit counts as a compilation is unverified, so no row says ``disk_hit``.
tpu-compile adds Dynamo's rows (:mod:`tpubench.compiles.dynamo`).
"""

from __future__ import annotations

from collections.abc import Callable

from tpubench.compiles import Capture, Event, StepFacts, step_phase


class TpuCapture(Capture):
    """Compile and cache-hit rows from per-step deltas of TorchTPU's cache counters.

    ``stats`` reads the counters (``tpubench.backends.tpu.tpu_cache_stats``: None where the
    private API is missing, which then leaves the rows out).
    """

    def __init__(self, stats: Callable[[], dict[str, int] | None]):
        super().__init__()
        self.stats = stats
        self._last: dict[str, int] | None = None

    def start(self) -> None:
        self._last = self.stats()

    def before_step(self, step: int, phase: str) -> None:
        if self._last is not None and step == 0:
            self.events.extend(self._delta(None, "setup"))

    def after_step(self, step: int, phase: str) -> StepFacts:
        self.events.extend(self._delta(step, phase))
        return StepFacts()

    def after_warmup(self, fail_on_recompile: bool) -> None:
        """Make any compile after warm-up an error: TorchTPU's cache-only mode."""
        if fail_on_recompile:
            import torch

            setter = getattr(getattr(torch, "tpu", None), "_set_cache_only", None)
            if setter is not None:
                setter(True)

    def _delta(self, step: int | None, phase: str) -> list[Event]:
        now = self.stats()
        if now is None or self._last is None:
            return []
        grown = {key: now[key] - self._last.get(key, 0) for key in now}
        self._last = now
        table_step, table_phase = step_phase(step, phase)
        events = []
        if grown.get("num_compilations", 0) > 0:
            events.append(
                Event(
                    "compile",
                    "tpu",
                    table_step,
                    table_phase,
                    cause="unknown",
                    raw="torch.tpu._get_cache_stats: num_compilations",
                    cache="miss",
                    count=grown["num_compilations"],
                )
            )
        return events
