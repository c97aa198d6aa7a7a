"""``tpubench run``: plan the runs, run each in its worker, store and summarise them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tpubench import report
from tpubench.backends import BACKENDS
from tpubench.backends.tpu import EAGER_MODES
from tpubench.cli.common import (
    BadInput,
    app,
    choose,
    console,
    int_list,
    key_values,
    sigterm_as_interrupt,
    writable_dir,
    writable_results,
)
from tpubench.cli.context import AttentionOption, attention_settings, refuse_what_cannot_fit, with_attention
from tpubench.cli.planning import (
    DevicesOption,
    InputsOption,
    LossOption,
    ModelConfigOption,
    ModelOption,
    ParallelOption,
    PrecisionOption,
    ScalingOption,
    TaskOption,
    TpOption,
    WorkloadModuleOption,
    choose_runs,
    custom_model,
    device_options,
    plan_runs,
    precision_options,
    precision_runs,
    pythons,
    shape_options,
    use_workload_modules,
)
from tpubench.launchers import ray as ray_launcher
from tpubench.memory import PROFILE_MEMORY_BACKENDS
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.runner import SuiteRunner
from tpubench.spec import DTYPES, RunSpec

if TYPE_CHECKING:
    from workloads import Workload


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
        if phase == "wait":  # another tpubench holds the device: said once, on its own line
            self.progress.console.print(f"  {spec.label()}: {event['detail']}", highlight=False)
        label = {"build": "building", "compile": "first step (compile)", "warmup": "warm-up", "measure": "measure"}.get(
            phase, phase
        )
        self.progress.update(self.current, description=f"{spec.label()}: {label}", completed=step, total=of)

    def on_finish(self, spec: RunSpec, row: dict[str, Any]) -> None:
        self.progress.advance(self.overall)
        self.progress.console.print(
            f"  {spec.label()}: {row['status']}"
            + (f"  median {row['median_step_ms']:.2f} ms" if row.get("median_step_ms") is not None else "")
        )


@app.command("run")
def run(
    suite: Annotated[str | None, typer.Option(help="Suite to run (default: every workload).")] = None,
    workload: Annotated[list[str] | None, typer.Option(help="Workload name; repeatable.")] = None,
    backend: Annotated[list[str] | None, typer.Option(help="Backend; repeatable (default: all available).")] = None,
    mode: Annotated[
        list[str] | None, typer.Option(help="train, infer, prefill or decode; repeatable (default: train, infer).")
    ] = None,
    size: Annotated[
        list[str] | None,
        typer.Option(help="Size name(s), e.g. tiny or tiny,124m; repeatable (default: each workload's)."),
    ] = None,
    batch_size: Annotated[
        str | None, typer.Option(help="Batch size(s), e.g. 8 or 1,8,32 (default: per device).")
    ] = None,
    seq_len: Annotated[
        str | None, typer.Option(help="Sequence length(s) of text workloads; for prefill/decode the prompt.")
    ] = None,
    image_size: Annotated[
        str | None, typer.Option(help="Image size(s) in pixels per side for vision workloads, e.g. 224 or 64,224.")
    ] = None,
    latent_size: Annotated[
        str | None, typer.Option(help="Latent size(s) per side for diffusion workloads (256 px images: 32).")
    ] = None,
    prompt_len: Annotated[str | None, typer.Option(help="Prompt length(s) for prefill/decode (= --seq-len).")] = None,
    gen_len: Annotated[str | None, typer.Option(help="Output tokens per sequence for decode, e.g. 128.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help=f"One of {', '.join(DTYPES)} (default: float32, or --precision's).")
    ] = None,
    precision: PrecisionOption = None,
    attention: AttentionOption = None,
    devices: DevicesOption = None,
    parallel: ParallelOption = None,
    tp: TpOption = None,
    scaling: ScalingOption = None,
    warmup: Annotated[int, typer.Option(min=0, help="Minimum warm-up steps (more while compiling).")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Measured steps per run.")] = 10,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a run's worker is killed.")] = 600.0,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every run; repeatable.")] = None,
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    resume: Annotated[bool, typer.Option(help="Skip runs with an ok row and the same fingerprint.")] = False,
    profile: Annotated[bool, typer.Option(help="Trace extra steps after the measured ones.")] = False,
    profile_steps: Annotated[int, typer.Option(min=1, help="Steps traced with --profile.")] = 3,
    profile_memory: Annotated[
        bool,
        typer.Option(help="One more step under torch.profiler's memory profile: memory by category over time."),
    ] = False,
    compile_cache: Annotated[
        Path | None,
        typer.Option(help="Shared compilation cache (DIR/xla, DIR/inductor); default: a fresh, cold one per run."),
    ] = None,
    verify: Annotated[bool, typer.Option(help="Compare outputs with a CPU float32 reference.")] = False,
    capture_compiles: Annotated[
        bool, typer.Option(help="Record each compile, graph break and host read (the compiles table).")
    ] = True,
    fail_on_recompile: Annotated[
        bool, typer.Option(help="Fail a run that compiles after warm-up, naming the cause and line.")
    ] = False,
    tpu_eager_mode: Annotated[
        str | None, typer.Option(help=f"TorchTPU eager mode for tpu backends: {' or '.join(EAGER_MODES)}.")
    ] = None,
    wide: Annotated[bool, typer.Option(help="Every summary column, however wide the terminal.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The rows as JSON on stdout; progress on stderr.")] = False,
    hosts: Annotated[
        int,
        typer.Option(
            min=1,
            help="Hosts each run spans (--devices is the total, split evenly); every host runs the same "
            "command, or --on ray places them (docs/multi-host.md).",
        ),
    ] = 1,
    node_rank: Annotated[
        int | None,
        typer.Option(
            min=0, help="With --hosts: this host's index (default: JOB_COMPLETION_INDEX, SLURM_NODEID, TPU_WORKER_ID)."
        ),
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            help="With --hosts: HOST:PORT where host 0 holds the rendezvous (default: the first of "
            "TPU_WORKER_HOSTNAMES, MASTER_ADDR or Slurm's node list, port MASTER_PORT or 29500)."
        ),
    ] = None,
    join_timeout: Annotated[
        float | None,
        typer.Option(min=1, help="With --hosts: seconds the hosts wait for each other (default: half --timeout)."),
    ] = None,
    on: Annotated[
        str, typer.Option(help="Where runs execute: local, or ray (one task per run on a cluster).")
    ] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to join with --on ray (default: RAY_ADDRESS, else auto).")
    ] = None,
    model: ModelOption = None,
    inputs: InputsOption = None,
    loss: LossOption = None,
    model_config: ModelConfigOption = None,
    task: TaskOption = None,
    workload_module: WorkloadModuleOption = None,
) -> None:
    """Run workloads (or your own model: --model) on backends, each run in its own worker, and
    store the results as parquet."""
    if not results.strip():
        raise BadInput("--results needs a directory")
    if profile_memory:  # before any model is imported or planned, or the store made
        profile_memory_backends(choose("backend", backend, list(BACKENDS)))
    numbers = precision_options(precision, dtype, verify)
    spread = host_options(hosts, node_rank, master, join_timeout, devices, on, resume, timeout)
    results_dir = writable_results(results)
    interpreters = pythons(python)
    use_workload_modules(workload_module, model)  # before Ray's actors copy this environment
    fleet = join_fleet(on, resume, backend, interpreters, ray_address, str(results_dir))
    custom = custom_model(model, inputs, loss, model_config, task, suite, workload)
    choice = choose_runs(suite, workload, backend, mode, size, numbers["dtype"], custom)
    if tpu_eager_mode is not None:
        choose("TPU eager mode", [tpu_eager_mode], list(EAGER_MODES))

    forced = attention_settings(attention, choice.backends)
    if compile_cache is not None:
        compile_cache = writable_dir("--compile-cache", compile_cache)
    specs = plan_runs(
        choice,
        **numbers,
        **shape_options(choice, batch_size, seq_len, prompt_len, gen_len, image_size, latent_size),
        **device_options(devices, parallel, tp, scaling),
        warmup=warmup,
        steps=steps,
        timeout_s=timeout,
        profile_steps=profile_steps if profile else 0,
        profile_memory=profile_memory,
        compile_cache=str(compile_cache) if compile_cache else None,
        tpu_eager_mode=tpu_eager_mode,
        verify=verify,
        capture_compiles=capture_compiles,
        fail_on_recompile=fail_on_recompile,
        **forced,
        **spread,
    )
    specs, precision_notes = precision_runs(choice, specs)
    out = Console(stderr=True, markup=False) if as_json else console
    specs, without_kernel = with_attention(specs)
    for note in [*left_out(choice.workloads, choice.sizes, choice.modes), *precision_notes, *without_kernel]:
        out.print(note, highlight=False)
    if not specs:
        raise BadInput("nothing to run: no chosen workload has the chosen sizes and modes")
    runner = SuiteRunner(results_dir=results_dir, pythons=interpreters, tags=key_values("--tag", tag), resume=resume)
    if not choice.backends:  # by default, only what this machine (or the fleet) can run
        available = fleet_backends(interpreters, ray_address) if fleet else local_backends(runner)
        specs = [spec for spec in specs if spec.backend in available]
    if forced and not fleet:  # a long-context sweep: a length that cannot fit is refused before any run
        refuse_what_cannot_fit(specs, runner)
    with suite_progress(runner, len(specs), out) as received:
        rows = fleet.run(runner, specs) if fleet else runner.run(specs)
    if fleet:
        ray_launcher.disconnect()
    if spread.get("node_rank"):
        follow_host0(out, rows, spread["node_rank"], hosts, as_json, verify)
    if as_json:
        print(json.dumps(rows, default=str, indent=1))
    if runner.resumed:
        out.print(
            f"--resume: skipped {len(runner.resumed)} run(s) already stored with the same settings and fingerprint"
        )
    if rows and not as_json:
        print_summary(out, rows, wide)
    for line in report.notes(rows):
        out.print(line, highlight=False)
    out.print(f"results: {results_dir} (invocation {runner.invocation_id})")
    if runner.interrupted:
        out.print("interrupted: finished runs were saved")
        raise typer.Exit(128 + (received[0] if received else signal.SIGINT))


LAUNCHERS = ("local", "ray")


def profile_memory_backends(backends: list[str]) -> None:
    """``--profile-memory`` needs torch.profiler's allocator events, which CPU and CUDA have
    and XLA and TorchTPU do not: refused before anything runs unless every backend named has
    them (a run without the timeline it was asked for would pass unnoticed in a matrix)."""
    cannot = [b for b in backends if b not in PROFILE_MEMORY_BACKENDS] if backends else ["(every available)"]
    if cannot:
        raise BadInput(
            f"--profile-memory works on backends {', '.join(PROFILE_MEMORY_BACKENDS)} only, not "
            f"{', '.join(cannot)}; name them with --backend (the breakdown columns need no flag on any backend)"
        )


def host_options(
    hosts: int,
    node_rank: int | None,
    master: str | None,
    join_timeout: float | None,
    devices: str | None,
    on: str,
    resume: bool,
    timeout: float,
) -> dict[str, Any]:
    """``--hosts`` and its companions as :class:`RunSpec` fields, checked before anything
    runs: the devices divide evenly, and (your own launcher) this host's index and host 0's
    address come from the options or the launcher's environment (:mod:`tpubench.parallel.hosts`)."""
    from tpubench.parallel import hosts as host_place

    if hosts == 1:
        extra = [name for name, value in (("--node-rank", node_rank), ("--master", master),
                                          ("--join-timeout", join_timeout)) if value is not None]  # fmt: skip
        if extra:
            verb = "apply" if len(extra) > 1 else "applies"
            raise BadInput(f"{', '.join(extra)} {verb} to a run over several hosts: add --hosts N")
        return {}
    if devices is None:
        raise BadInput(
            f"--hosts {hosts} needs --devices, the total over all hosts (a multiple of {hosts}; "
            f"one device per host is --devices {hosts})"
        )
    try:
        host_place.check_hosts(int_list("--devices", devices) or [1], hosts)
    except host_place.HostsError as error:
        raise BadInput(str(error)) from error
    if resume:
        raise BadInput("--resume is not supported with --hosts: only host 0 holds the stored rows")
    if join_timeout is not None and join_timeout >= timeout:
        raise BadInput(
            f"--join-timeout {join_timeout:g} must be shorter than --timeout {timeout:g}, which includes the wait "
            "for the hosts"
        )
    options: dict[str, Any] = {"hosts": hosts, "join_timeout_s": join_timeout}
    if on == "ray":
        if node_rank is not None or master is not None:
            raise BadInput(
                "--node-rank and --master are for your own launcher; with --on ray, Ray places the hosts and "
                "host 0's actor holds the rendezvous"
            )
        return options
    try:
        place = host_place.place(hosts, node_rank, master, os.environ)
    except host_place.HostsError as error:
        raise BadInput(str(error)) from error
    return {**options, "node_rank": place.node_rank, "master": place.master}


def follow_host0(
    out: Console, rows: list[dict[str, Any]], node_rank: int, hosts: int, as_json: bool, verify: bool = False
) -> None:
    """Another host than host 0: what host 0 stored for each run (this host writes no row);
    the invocation ends as host 0's does, or with exit code 1 where host 0 never answered.
    Host 0 verifies (--verify) after it told the others the run's status: the verdict is in its row."""
    lost = [row for row in rows if row.get("host_row") is None or not row.get("host0_answered", True)]
    out.print(
        f"host {node_rank} of {hosts}: host 0 writes the rows (under its --results); it recorded "
        + ", ".join(f"{row['status']}" + (f" ({row['error']})" if row.get("error") else "") for row in rows)
        + ("; --verify's verdict follows in host 0's rows" if verify else ""),
        highlight=False,
    )
    if as_json:
        print(json.dumps(rows, default=str, indent=1))
    raise typer.Exit(1 if lost else 0)


def join_fleet(
    on: str, resume: bool, backends: list[str] | None, interpreters: dict[str, str], address: str | None, results: str
) -> ray_launcher.FleetRun | None:
    """For ``--on ray``: join the cluster and start the actors that the named backends' runs
    will need, before the workload registry (and torch) is imported and the runs planned, so
    that the actors' fork servers boot meanwhile, as a local run's boots while the CLI imports.
    None for a local run."""
    choose("launcher (--on)", [on], list(LAUNCHERS))
    if on == "local":
        return None
    if resume:
        raise BadInput("--resume is not supported with --on ray: each node's fingerprint is known only once it runs")
    named = choose("backend", backends, list(BACKENDS))
    try:
        fleet = ray_launcher.FleetRun(ray_launcher.connect(address), results, interpreters)
    except (RuntimeError, ConnectionError) as error:
        raise BadInput(f"--on ray: {error}") from error
    fleet.warm(named)
    return fleet


def local_backends(runner: SuiteRunner) -> set[str]:
    probes = runner.probe_all(list(BACKENDS))
    return {name for name, probe in probes.items() if probe["backends"][name]["available"]}


def fleet_backends(interpreters: dict[str, str], address: str | None) -> set[str]:
    """The backends some node kind of the Ray cluster can run."""
    try:
        fleet = ray_launcher.probe_fleet(list(BACKENDS), interpreters, address)
    except (RuntimeError, ConnectionError) as error:
        raise BadInput(f"--on ray: {error}") from error
    return {name for kind in fleet for name, probe in kind["probes"].items() if probe["backends"][name]["available"]}


def left_out(workloads: list[Workload], sizes: list[str], modes: list[str]) -> list[str]:
    """A note for each workload that lacks some of the chosen sizes or modes (it runs without
    them, or not at all), so a selection never shrinks without a word."""
    notes = []
    for workload in workloads:
        lacks = [f"size {s}" for s in sizes if s not in workload.sizes]
        lacks += [f"mode {m}" for m in modes if m not in workload.modes]
        if lacks:
            dropped = any(
                all(x not in have for x in chosen)
                for chosen, have in ((sizes, workload.sizes), (modes, workload.modes))
                if chosen
            )
            has = f"sizes {', '.join(workload.sizes)}; modes {', '.join(workload.modes)}"
            what = "left out" if dropped else "runs without some of them"
            notes.append(f"note: {workload.name} has no {', '.join(lacks)} ({has}): {what}")
    return notes


def print_summary(out: Console, rows: list[dict[str, Any]], wide: bool) -> None:
    """The summary table, narrowed to the terminal unless ``wide``; says what it left out."""
    table, hidden = report.summary_table(rows, None if wide else out.width, out)
    if wide:  # as wide as the table, past the terminal's (or COLUMNS') width, which caps out.print's
        needed = Measurement.get(out, out.options.update(width=10_000), table).maximum
        wider = Console(file=out.file, width=max(needed, out.width), color_system=out.color_system, markup=False)
        wider.print(table)
    else:
        out.print(table)
    if hidden:
        out.print(
            f"(not shown at {out.width} columns: {', '.join(hidden)}; --wide shows them, --json gives every field)"
        )


@contextlib.contextmanager
def suite_progress(runner: SuiteRunner, total: int, out: Console) -> Iterator[list[int]]:
    """A suite's live progress (overall, and the current run's phase) on ``out``, with SIGTERM
    stopping it the way Ctrl-C does; yields the signals received (see :func:`.common.sigterm_as_interrupt`)."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with sigterm_as_interrupt() as received, Progress(*columns, console=out, transient=True) as progress:
        runner.observer = ProgressObserver(progress, total)
        yield received
