"""The ``tpubench`` command line: list workloads, show the environment, run suites.

Bad input (an unknown name, a nonsense number) ends with one ``error:`` line naming the
valid choices and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.exceptions import TyperException

from tpubench import __version__, report
from tpubench.backends import BACKENDS
from tpubench.backends.tpu import EAGER_MODES
from tpubench.fingerprint import git_sha, host_facts
from tpubench.runner import SuiteRunner, plan
from tpubench.spec import DTYPES, RunSpec
from tpubench.store import DEFAULT_RESULTS_DIR
from workloads import GENERATION_MODES, MODES, Workload, registry, suites

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Benchmark the same PyTorch models on CPU, GPU and TPU backends.",
)
# Piped output (CI logs, README examples) is not squeezed into 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)


class BadInput(TyperException):
    """Raised for user input we reject; printed as one line, exit code 2."""

    exit_code = 2


def _choose(kind: str, wanted: list[str] | None, valid: list[str]) -> list[str]:
    for name in wanted or []:
        if name not in valid:
            raise BadInput(f"unknown {kind} {name!r}; valid: {', '.join(valid)}")
    return list(dict.fromkeys(wanted)) if wanted else []


def _key_values(option: str, pairs: list[str] | None) -> dict[str, str]:
    parsed = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"{option} expects KEY=VALUE, got {pair!r}")
        parsed[key] = value
    return parsed


def _pythons(pairs: list[str] | None) -> dict[str, str]:
    pythons = _key_values("--python", pairs)
    _choose("backend", list(pythons), list(BACKENDS))
    return pythons


def _int_list(option: str, text: str | None) -> list[int] | None:
    """``"1,8,32"`` as ``[1, 8, 32]`` (a sweep); anything but positive integers is a BadInput."""
    if text is None:
        return None
    values = [part.strip() for part in text.split(",")]
    if not all(value.isdigit() and int(value) > 0 for value in values):
        raise BadInput(f"{option} expects positive integers separated by commas, got {text!r}")
    return list(dict.fromkeys(int(value) for value in values))


def _writable_dir(option: str, path: Path) -> Path:
    """``path`` made absolute, created if missing; a BadInput if it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BadInput(f"{option} {path}: cannot create it ({error.strerror})") from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {path}: directory is not writable")
    return path.resolve()


def _select_workloads(suite: str | None, names: list[str] | None) -> list[Workload]:
    known, grouped = registry(), suites()
    if suite is not None and suite not in grouped:
        raise BadInput(f"unknown suite {suite!r}; valid: {', '.join(grouped)}")
    pool = grouped[suite] if suite else list(known)
    chosen = _choose("workload", names, pool) or pool
    return [known[name] for name in chosen]


@app.command("list")
def list_workloads(
    suite: Annotated[str | None, typer.Option(help="Only this suite's workloads.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the workloads with their suite, family, sizes, modes and default shapes."""
    entries = [
        {
            "name": w.name,
            "suite": w.suite,
            "family": w.family,
            "description": w.description,
            "sizes": list(w.sizes),
            "default_size": w.default_size,
            "modes": list(w.modes),
            "default_shape": {
                kind: {"batch_size": s.batch_size, "seq_len": s.seq_len} for kind, s in w.default_shape.items()
            },
        }
        for w in _select_workloads(suite, None)
    ]
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    table = Table(title="tpubench workloads")
    for header in ("workload", "suite", "family", "sizes (default*)", "modes", "batch x seq (cpu / cuda / tpu)"):
        table.add_column(header)
    for entry in entries:
        sizes = ", ".join(f"{s}*" if s == entry["default_size"] else s for s in entry["sizes"])
        shapes = " / ".join(f"{s['batch_size']}x{s['seq_len']}" for s in entry["default_shape"].values())
        table.add_row(entry["name"], entry["suite"], entry["family"], sizes, ", ".join(entry["modes"]), shapes)
    console.print(table)


@app.command("env")
def show_env(
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show every backend, available or not (and why), with device, versions and host."""
    runner = SuiteRunner(results_dir=DEFAULT_RESULTS_DIR, pythons=_pythons(python))
    probes = runner.probe_all(list(BACKENDS))
    info = {
        "tpubench_version": __version__,
        "git_sha": git_sha(),
        **host_facts(),
        "backends": {
            name: {
                **probe["backends"][name],
                "python": probe["executable"],
                "python_version": probe["python_version"],
                "torch_version": probe["torch_version"],
            }
            for name, probe in probes.items()
        },
    }
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"tpubench {info['tpubench_version']} (git {info['git_sha'] or 'n/a'}) on {info['host']}")
    console.print(f"cpu: {info['cpu_model']}; os: {info['os']}")
    table = Table(title="backends")
    for header in ("backend", "available", "device", "count", "python / torch", "versions", "reason"):
        table.add_column(header)
    for name, entry in info["backends"].items():
        table.add_row(
            name,
            "yes" if entry["available"] else "no",
            entry["device_name"] or "-",
            str(entry["device_count"] or "-"),
            f"{entry['python_version'] or '?'} / {entry['torch_version'] or '?'}",
            ", ".join(f"{k} {v}" for k, v in entry["versions"].items()) or "-",
            entry["reason"] or "",
        )
    console.print(table)


class ProgressObserver:
    """Overall progress plus the current run's phase (compile, warm-up, measure)."""

    def __init__(self, progress: Progress, total: int):
        self.progress = progress
        self.overall = progress.add_task("suite", total=total)
        self.current = progress.add_task("", total=None)

    def on_start(self, index: int, total: int, spec: RunSpec) -> None:
        self.progress.update(self.current, description=f"{spec.label()}: starting", completed=0, total=None)

    def on_event(self, spec: RunSpec, event: dict[str, Any]) -> None:
        phase, step, of = event["phase"], event["step"], event["of"]
        label = {"build": "building", "compile": "first step (compile)", "warmup": "warm-up", "measure": "measure"}.get(
            phase, phase
        )
        self.progress.update(self.current, description=f"{spec.label()}: {label}", completed=step, total=of)

    def on_finish(self, spec: RunSpec, row: dict[str, Any]) -> None:
        self.progress.advance(self.overall)
        self.progress.console.print(
            f"  {spec.label()}: {row['status']}"
            + (f"  median {row['median_step_ms']:.2f} ms" if row["status"] == "ok" else "")
        )


@app.command("run")
def run(
    suite: Annotated[str | None, typer.Option(help="Suite to run (default: every workload).")] = None,
    workload: Annotated[list[str] | None, typer.Option(help="Workload name; repeatable.")] = None,
    backend: Annotated[list[str] | None, typer.Option(help="Backend; repeatable (default: all available).")] = None,
    mode: Annotated[
        list[str] | None, typer.Option(help="train, infer, prefill or decode; repeatable (default: train, infer).")
    ] = None,
    size: Annotated[list[str] | None, typer.Option(help="Size name; repeatable (default: each workload's).")] = None,
    batch_size: Annotated[
        str | None, typer.Option(help="Batch size(s), e.g. 8 or 1,8,32 (default: per device).")
    ] = None,
    seq_len: Annotated[str | None, typer.Option(help="Sequence length(s); for prefill/decode the prompt.")] = None,
    prompt_len: Annotated[str | None, typer.Option(help="Prompt length(s) for prefill/decode (= --seq-len).")] = None,
    gen_len: Annotated[str | None, typer.Option(help="Output tokens per sequence for decode, e.g. 128.")] = None,
    dtype: Annotated[str, typer.Option(help=f"One of {', '.join(DTYPES)}.")] = "float32",
    warmup: Annotated[int, typer.Option(min=0, help="Minimum warm-up steps (more while compiling).")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps per run.")] = 10,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a run's worker is killed.")] = 600.0,
    results: Annotated[Path, typer.Option(help="Results directory.")] = DEFAULT_RESULTS_DIR,
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every run; repeatable.")] = None,
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    resume: Annotated[bool, typer.Option(help="Skip runs with an ok row and the same fingerprint.")] = False,
    profile: Annotated[bool, typer.Option(help="Trace extra steps after the measured ones.")] = False,
    profile_steps: Annotated[int, typer.Option(min=1, help="Steps traced with --profile.")] = 3,
    compile_cache: Annotated[
        Path | None,
        typer.Option(help="Shared compilation cache (DIR/xla, DIR/inductor); default: a fresh, cold one per run."),
    ] = None,
    verify: Annotated[bool, typer.Option(help="Compare outputs with a CPU float32 reference.")] = False,
    tpu_eager_mode: Annotated[
        str | None, typer.Option(help=f"TorchTPU eager mode for tpu backends: {' or '.join(EAGER_MODES)}.")
    ] = None,
) -> None:
    """Run workloads on backends, each run in its own worker, and store the results as parquet."""
    chosen_workloads = _select_workloads(suite, workload)
    chosen_backends = _choose("backend", backend, list(BACKENDS))
    chosen_modes = _choose("mode", mode, list(MODES + GENERATION_MODES))
    _choose("dtype", [dtype], list(DTYPES))
    if tpu_eager_mode is not None:
        _choose("TPU eager mode", [tpu_eager_mode], list(EAGER_MODES))
    all_sizes = list(dict.fromkeys(s for w in chosen_workloads for s in w.sizes))
    chosen_sizes = _choose("size", size, all_sizes)
    if compile_cache is not None:
        compile_cache = _writable_dir("--compile-cache", compile_cache)
    if seq_len is not None and prompt_len is not None:
        raise BadInput("--seq-len and --prompt-len are the same setting; give one")
    batch_sizes = _int_list("--batch-size", batch_size)
    seq_lens = _int_list("--prompt-len" if prompt_len else "--seq-len", prompt_len or seq_len)
    gen_lens = _int_list("--gen-len", gen_len)
    try:
        specs = plan(
            chosen_workloads,
            sizes=chosen_sizes,
            backends=chosen_backends or list(BACKENDS),
            modes=chosen_modes,
            dtype=dtype,
            batch_size=batch_sizes,
            seq_len=seq_lens,
            gen_len=gen_lens,
            warmup=warmup,
            steps=steps,
            timeout_s=timeout,
            profile_steps=profile_steps if profile else 0,
            compile_cache=str(compile_cache) if compile_cache else None,
            tpu_eager_mode=tpu_eager_mode,
            verify=verify,
        )
    except ValueError as error:
        raise BadInput(str(error)) from error
    runner = SuiteRunner(results_dir=results, pythons=_pythons(python), tags=_key_values("--tag", tag), resume=resume)
    if not chosen_backends:  # by default, only what this machine can run
        probes = runner.probe_all(list(BACKENDS))
        specs = [spec for spec in specs if probes[spec.backend]["backends"][spec.backend]["available"]]
    with (
        _sigterm_as_interrupt() as received,
        Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress,
    ):
        runner.observer = ProgressObserver(progress, len(specs))
        rows = runner.run(specs)
    if runner.resumed:
        console.print(f"--resume: skipped {len(runner.resumed)} run(s) already stored with this fingerprint")
    if rows:
        console.print(report.summary_table(rows))
    for line in report.notes(rows):
        console.print(line, markup=False, highlight=False)
    console.print(f"results: {results}/runs (invocation {runner.invocation_id})")
    if runner.interrupted:
        console.print("interrupted: finished runs were saved")
        raise typer.Exit(128 + (received[0] if received else signal.SIGINT))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a cancelled CI job, ``kill``) stops a suite the way Ctrl-C does: the run in
    flight is abandoned, finished runs are kept. Yields the signals received."""
    received: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except TyperException as error:  # our BadInput and the parser's usage errors alike
        print(f"error: {error.format_message()}", file=sys.stderr)
        sys.exit(error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
