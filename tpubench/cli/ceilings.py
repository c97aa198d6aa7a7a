"""``tpubench ceilings``: measure what each device reaches, or show what was measured.

Measuring plans one sweep per backend and kind (per group size for collectives), checks
every choice against what the backends' probes say the devices have (a dtype, the memory
a size needs, the devices a collective needs) before anything runs, and calls down through
the runner (:func:`tpubench.runner.run_ceilings`). ``--show`` reads the store's ``ceilings``
table through :mod:`tpubench.analysis.ceilings`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tpubench import ceilings
from tpubench.analysis.ceilings import across_text, rate_text, time_text
from tpubench.analysis.nulls import is_missing
from tpubench.backends import BACKENDS, get_backend
from tpubench.cli.common import BadInput, app, choose, console, key_values, writable_results
from tpubench.cli.planning import pythons
from tpubench.results_dir import DEFAULT_RESULTS_DIR
from tpubench.runner import SuiteRunner, run_ceilings

#: the tensor dtypes of the kinds other than matmul (TF32 and fp8 are matmul modes)
TENSOR_DTYPES = ("float32", "bfloat16", "float16")


#: the smallest point of each kind's sweep: a --max-size below it leaves the kind nothing
SMALLEST = {"matmul": ceilings.MATMUL_MIN, "memory": ceilings.MEMORY_MIN, "collective": ceilings.COLLECTIVE_MIN}


def show(results: str, selector: str | None, as_json: bool) -> None:
    """The table of measured ceilings, each beside the data sheet's figure and their ratio."""
    from tpubench import store
    from tpubench.analysis import ceilings as analysis
    from tpubench.analysis.select import SelectorError, select_runs
    from tpubench.schema import CEILINGS

    try:
        frame = store.load_ceilings(results)
    except store.StoreError as error:
        raise BadInput(str(error)) from error
    if frame.empty:
        raise BadInput(f"no ceilings in {results}; `tpubench ceilings --backend cpu` measures some")
    if selector:
        try:
            frame = select_runs(frame, selector, CEILINGS.names)
        except SelectorError as error:
            raise BadInput(f"--select {selector!r}: {error}") from error
    lines = analysis.summary(frame)
    if as_json:
        print(lines.to_json(orient="records", date_format="iso", indent=1))
        return
    table = Table(title=f"measured ceilings ({results}): headline = median of the best point's samples")
    headers = ("backend", "device", "kind", "op", "dtype", "n", "best at", "median", "max", "data sheet", "ratio")
    for header in (*headers, "across sweeps"):
        table.add_column(header, justify="right" if header in ("n", "median", "max", "data sheet", "ratio") else "left")
    for row in lines.to_dict("records"):
        latency = row["kind"] == "latency"
        table.add_row(
            row["backend"],
            str(row["device"]) + (" (simulated)" if row["simulated"] is True else ""),
            row["kind"],
            row["op"],
            row["dtype"],
            str(int(row["devices"])),
            str(row["shape"]),
            (time_text(row["median_s"]) if latency else rate_text(row["median_rate"], row["rate_unit"]))
            + ("" if row["ceiling"] else " (a cache's)"),
            "-" if latency else rate_text(row["max_rate"], row["rate_unit"]),
            rate_text(row["datasheet"], row["rate_unit"]),
            "-" if is_missing(row["ratio"]) else f"{100 * row['ratio']:.1f}%",
            across_text(row),
        )
    console.print(table)
    console.print("each line's sweep (--select narrows the sweeps it is chosen from):", highlight=False)
    for key, choice in dict.fromkeys(
        (
            f"{row['backend']} {row['kind']} {row['dtype']}"
            + (f" x{int(row['devices'])}" if row["devices"] > 1 else ""),
            row["choice"],
        )
        for row in lines.to_dict("records")
    ):
        console.print(f"  {key}: {choice}", highlight=False)


def check_backend(
    backend: str,
    availability: dict[str, Any],
    kinds: list[str],
    dtypes: list[str],
    max_size: int | None,
    group_sizes: list[int] | None,
) -> None:
    """Refuse (one BadInput line) what ``backend``'s device cannot do: a dtype it lacks, a
    size its memory cannot hold (with the estimate), a collective without two devices."""
    device = availability.get("device_name") or backend
    supported = ceilings.supported_dtypes(backend, availability.get("compute_capability"))
    for dtype in dtypes:
        if "matmul" in kinds and dtype not in supported:
            raise BadInput(f"{backend} ({device}) has no {dtype} matmul; valid: {', '.join(supported)}")
    for kind in kinds:
        if max_size and max_size < SMALLEST.get(kind, 0):
            raise BadInput(f"--max-size {max_size} leaves no {kind} point; its smallest is {SMALLEST[kind]}")
    memory = availability.get("memory_bytes")
    if max_size and memory:
        for kind in kinds:
            need = max(ceilings.estimate_bytes(kind, max_size, dtype) for dtype in dtypes or ["float32"])
            if need > memory:
                raise BadInput(
                    f"--max-size {max_size}: a {kind} point needs about {need / 2**30:.1f} GiB, "
                    f"more than the {memory / 2**30:.1f} GiB of {device}"
                )
    if "collective" in kinds:
        if not ceilings.has_collectives(backend):
            raise BadInput(
                f"collective ceilings on {backend} have no sweep; "
                f"valid: {', '.join(b for b in BACKENDS if ceilings.has_collectives(b))}"
            )
        have = availability.get("parallel_devices") or 1
        if have < 2:
            raise BadInput(f"collective ceilings need at least 2 devices; {backend} has {have} here ({device})")
        too_many = [n for n in group_sizes or [] if n > have]
        if too_many:
            raise BadInput(f"--group-size {too_many[0]}: {backend} has {have} devices here ({device})")


def plan(
    backend: str,
    availability: dict[str, Any],
    kinds: list[str],
    dtypes: list[str],
    max_size: int | None,
    full: bool,
    group_sizes: list[int] | None,
    timeout_s: float,
) -> list[ceilings.CeilingSpec]:
    """The sweeps of one backend: one per kind, a collective one per group size."""
    capability = availability.get("compute_capability")
    specs = []
    for kind in kinds:
        if kind == "matmul":
            chosen = tuple(dtypes) or ceilings.default_dtypes(backend, capability)
        elif kind == "latency":  # an empty step has no dtype to speak of
            chosen = ("float32",)
        else:
            chosen = tuple(d for d in dtypes if d in TENSOR_DTYPES) or ("float32",)
        common = {"backend": backend, "kind": kind, "max_size": max_size, "full": full, "timeout_s": timeout_s}
        if kind != "collective":
            specs.append(ceilings.CeilingSpec(dtypes=chosen, **common))
            continue
        have = availability.get("parallel_devices") or 1
        # simulated devices (gloo ranks, PJRT CPU's virtual devices) share the host's cores:
        # a group of 2 checks the plumbing by default, --full tries every group size
        simulated = get_backend(backend).simulated_devices()
        simulated_default = [2] if simulated and not full else list(ceilings.GROUP_SIZES)
        for group in group_sizes or [n for n in simulated_default if n <= have]:
            specs.append(ceilings.CeilingSpec(dtypes=chosen[:1], devices=group, **common))
    return specs


def _summary_line(spec: ceilings.CeilingSpec, rows: list[dict[str, Any]]) -> str:
    ok = [row for row in rows if row["status"] == "ok" and row.get("median_s") is not None]
    if not ok:
        return f"  {spec.label()}: {rows[0]['status']}: {rows[0].get('error')}"
    import pandas as pd

    from tpubench.analysis import ceilings as analysis

    points = pd.DataFrame(ok)
    best = analysis.best_point(points)
    if is_missing(best.get("median_rate")):
        return f"  {spec.label()}: ok, {len(ok)} points; {best['op']} {time_text(best['median_s'])}"
    failed = len(rows) - len(ok)
    line = (
        f"  {spec.label()}: ok, {len(ok)} points{f' ({failed} failed)' if failed else ''}; best "
        f"{best['op']} {best['dtype']} {rate_text(best['median_rate'], best['rate_unit'])} at {best['shape']}"
    )
    if spec.kind == "memory" and best["op"] in analysis.STREAM_OPS:
        reach = analysis.size_label(analysis.cache_reach(best.get("llc_bytes")))
        line += (
            f" (arrays past {analysis.LLC_MULTIPLE}x the last-level cache: {reach} and up)"
            if analysis.past_cache(points)[best.name]
            else f", a cache's figure: no array reached {reach} ({analysis.LLC_MULTIPLE}x the last-level cache), "
            "so this sweep sets no memory ceiling"
        )
    return line


@app.command("ceilings")
def ceilings_command(
    backend: Annotated[list[str] | None, typer.Option(help="Backend to measure; repeatable.")] = None,
    kind: Annotated[
        list[str] | None, typer.Option(help=f"{', '.join(ceilings.KINDS)}; repeatable (default: all that apply).")
    ] = None,
    dtype: Annotated[
        list[str] | None, typer.Option(help=f"{', '.join(ceilings.DTYPES)}; repeatable (default: the device's).")
    ] = None,
    max_size: Annotated[
        int | None, typer.Option(min=1, help="Largest point: matmul M=N=K, memory/collective bytes.")
    ] = None,
    group_size: Annotated[list[int] | None, typer.Option(min=2, help="Collective group size; repeatable.")] = None,
    full: Annotated[bool, typer.Option(help="Wider sweeps: larger sizes, more samples, every group size.")] = False,
    show_: Annotated[bool, typer.Option("--show", help="Show the measured ceilings instead of measuring.")] = False,
    select: Annotated[str | None, typer.Option(help="With --show: only these sweeps (a selector).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a sweep's worker is killed.")] = 900.0,
    results: Annotated[str, typer.Option(help="Results directory.")] = str(DEFAULT_RESULTS_DIR),
    tag: Annotated[list[str] | None, typer.Option(help="KEY=VALUE stored with every row; repeatable.")] = None,
    python: Annotated[list[str] | None, typer.Option(help="BACKEND=INTERPRETER for that backend's workers.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The rows as JSON on stdout.")] = False,
) -> None:
    """Measure the matmul FLOP/s, memory and collective bandwidth and launch latency each
    device reaches (its ceilings), or --show them beside the data sheet."""
    if show_:
        show(results, select, as_json)
        return
    if select:
        raise BadInput("--select goes with --show")
    backends = choose("backend", backend, list(BACKENDS))
    if not backends:
        raise BadInput(f"--backend is required; valid: {', '.join(BACKENDS)}")
    kinds = choose("kind", kind, list(ceilings.KINDS))
    dtypes = choose("dtype", dtype, list(ceilings.DTYPES))
    for name in backends:  # what the family never has is refused before any worker starts
        family_dtypes = ceilings.supported_dtypes(name)
        lacking = [d for d in dtypes if d not in family_dtypes]
        if lacking and (not kinds or "matmul" in kinds):
            raise BadInput(f"{name} has no {lacking[0]} matmul; valid: {', '.join(family_dtypes)}")
    tags = key_values("--tag", tag)
    results_dir = writable_results(results)
    runner = SuiteRunner(results_dir=results_dir, pythons=pythons(python), tags=tags)
    out = Console(stderr=True, markup=False) if as_json else console
    probes = runner.probe_all(backends)
    specs = []
    for name in backends:
        availability = probes[name]["backends"][name]
        # by default every kind that applies: collectives where there are devices to group, the
        # kinds whose smallest point --max-size allows (a kind named with --kind must fit)
        devices = availability.get("parallel_devices") or 1
        wanted = kinds or [
            k
            for k in ceilings.KINDS
            if (k != "collective" or (devices > 1 and ceilings.has_collectives(name)))
            and not (max_size and max_size < SMALLEST.get(k, 0))
        ]
        if availability["available"]:
            check_backend(name, availability, wanted, dtypes, max_size, group_size)
        specs += plan(name, availability, wanted, dtypes, max_size, full, group_size, timeout)

    def started(spec: ceilings.CeilingSpec) -> None:
        out.print(f"measuring {spec.label()} ...", highlight=False)

    by_run: dict[str, list[dict[str, Any]]] = {}
    rows = run_ceilings(runner, specs, on_start=started)
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(row)
    for spec in specs:
        if spec.run_id in by_run:
            out.print(_summary_line(spec, by_run[spec.run_id]), highlight=False)
    if as_json:
        print(json.dumps(rows, default=str, indent=1))
    out.print(f"results: {results_dir} (invocation {runner.invocation_id}); `tpubench ceilings --show` shows them")
    if runner.interrupted:
        out.print("interrupted: finished sweeps were saved")
        raise typer.Exit(130)
