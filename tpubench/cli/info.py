"""``tpubench list`` and ``tpubench env``: what can run, and where."""

from __future__ import annotations

import json
from typing import Annotated

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
