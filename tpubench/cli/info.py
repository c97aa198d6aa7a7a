"""``tpubench list`` and ``tpubench env``: what can run, and where."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from tpubench import __version__
from tpubench.backends import BACKENDS
from tpubench.cli.common import app, console, pythons, select_workloads
from tpubench.fingerprint import git_sha, host_facts
from tpubench.runner import SuiteRunner
from tpubench.store import DEFAULT_RESULTS_DIR


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
        for w in select_workloads(suite, None)
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
    runner = SuiteRunner(results_dir=DEFAULT_RESULTS_DIR, pythons=pythons(python))
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
    console.print(f"cpu: {info['cpu_model']}; os: {info['os']}", highlight=False)
    console.print(backends_table(info["backends"]))


def backends_table(backends: dict[str, dict[str, Any]]) -> Table:
    """One line per backend (device or reason), then its versions and interpreter: no borders
    and a wrapping last column, so it reads at 80 columns as well as at 200."""
    table = Table(box=None, show_header=True, pad_edge=False, title="backends", title_justify="left")
    table.add_column("backend", no_wrap=True)
    table.add_column("ok", no_wrap=True)
    table.add_column("device, or why not; versions; interpreter", overflow="fold")
    for name, entry in backends.items():
        count = f" x{entry['device_count']}" if entry["device_count"] else ""
        details = [f"{entry['device_name']}{count}" if entry["available"] else entry["reason"]]
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items())
        details.append(versions or f"torch {entry['torch_version'] or '?'}")
        details.append(f"python {entry['python_version'] or '?'} at {entry['python']}")
        table.add_row(name, "yes" if entry["available"] else "no", "\n".join(details))
    return table
