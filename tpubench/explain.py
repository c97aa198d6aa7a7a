"""``tpubench compiles RUN_ID --explain``: re-run a run's spec with the backend's own, costly
diagnostics on, and say from them what changed at each recompile.

The diagnostics cost a dump per sync (XLA) or a structured log per compile (Dynamo), so the
re-run's timings are not comparable with measured runs: it is stored nowhere (no row in the
store), and its files go to ``<results>/diagnostics/<run_id>-<time>/``, outside the tables.

- XLA (xla, xla-compile): ``XLA_IR_DEBUG=1`` gives every IR node the Python line that made it,
  and ``XLA_SAVE_TENSORS_FILE`` appends each synced graph with its trigger frames and hash.
  For every graph hash not seen before at a sync frame that already had a graph, the first IR
  node that differs from the most alike earlier graph there is the cause ("f32[8,16] →
  f32[12,16] aten::expand at x.py:6"); identical IR under a new hash is torch_xla's parameter
  sequence (pytorch/xla#3604). Measured on torch_xla 2.9 (PJRT CPU).
- Dynamo (cpu-, cuda-, xla-, tpu-compile): ``TORCH_TRACE`` to a folder, rendered by tlparse
  when it is installed.
- TorchTPU (tpu, tpu-compile): ``TORCH_TRACE`` (read by torch_tpu at import) plus
  ``torch.tpu._set_dump_on_cache_miss(True)`` through ``TPUBENCH_TPU_DUMP_ON_MISS``: written
  from reading the torch_tpu 0.2.0 wheel, not verified on a chip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from tpubench.spec import RunSpec

#: XLA_SAVE_TENSORS_FILE's base name in the diagnostics folder (torch_xla appends ``.<ordinal>``)
GRAPHS_FILE = "xla_graphs.txt"
TRACE_DIR = "torch_trace"
TLPARSE_HINT = "install it with `pip install tlparse`"
NOT_COMPARABLE = "diagnostic re-run: its timings are not comparable with measured runs, and nothing is stored"

_NODE = re.compile(r"^\s*%(\d+) = (\S+) (\S+?)\((.*?)\)(.*)$")
_LAYOUT = re.compile(r"\{[\d,]*\}")
_LOCATION = re.compile(r"location=([^,]+)")
_FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)$")
#: frames of these packages are not where a user's graph was cut
_LIBRARY = ("/torch/", "/torch_xla/", "/torch_tpu/", "/tpubench/", "/site-packages/", "<frozen")


class ExplainError(Exception):
    """The run cannot be re-run for diagnosis (its workload or backend is gone here)."""


@dataclass(frozen=True)
class Node:
    """One IR node of a dumped XLA graph."""

    shape: str  # f32[8,16] (layout left out: it follows the shape)
    op: str
    operands: str
    location: str  # fn@file:line, from XLA_IR_DEBUG

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two nodes the same node of a graph: not where Python made them."""
        return self.shape, self.op, self.operands


@dataclass(frozen=True)
class Graph:
    """One synced graph as XLA_SAVE_TENSORS_FILE writes it."""

    index: int
    hash: str
    frame: str  # the innermost frame outside the libraries that triggered the sync
    nodes: tuple[Node, ...]


def parse_graphs(text: str) -> list[Graph]:
    """The graphs of an ``XLA_SAVE_TENSORS_FILE`` dump (``XLA_SAVE_TENSORS_FMT=text``), in order."""
    graphs = []
    for index, block in enumerate(text.split("[ScheduleSyncTensorsGraph]")[1:]):
        frames = [m.groups() for line in block.split("## BEGIN_GRAPH")[0].splitlines() if (m := _FRAME.match(line))]
        user = [f"{Path(path).name}:{line}" for _, path, line in frames if not any(p in path for p in _LIBRARY)]
        nodes = []
        for line in block.splitlines():
            if match := _NODE.match(line):
                _, shape, op, operands, rest = match.groups()
                location = _LOCATION.search(rest)
                nodes.append(Node(_LAYOUT.sub("", shape), op, operands, location.group(1) if location else ""))
        found = re.search(r"Graph Hash: (\w+)", block)
        graphs.append(Graph(index, found.group(1) if found else "", user[-1] if user else "", tuple(nodes)))
    return graphs


def _where(location: str) -> str:
    """``forward@x.py:6`` as ``x.py:6``."""
    return location.rsplit("@", 1)[-1] if location else "an unknown line"


def library_files() -> frozenset[str]:
    """The file names of torch's and torch_xla's Python sources, as XLA_IR_DEBUG names a node's
    file (``linear.py``): a changed node made there is not where the user's code changed it."""
    import importlib.util

    names: set[str] = set()
    for package in ("torch", "torch_xla", "torch_tpu"):
        spec = importlib.util.find_spec(package)
        folders = (spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            names.update(path.name for path in Path(folder).rglob("*.py"))
    return frozenset(names)


def _changed(old: Node, new: Node) -> str:
    if old.op == new.op and old.shape != new.shape:
        return f"{old.shape} \N{RIGHTWARDS ARROW} {new.shape} {new.op} at {_where(new.location)}"
    return f"{old.shape} {old.op} \N{RIGHTWARDS ARROW} {new.shape} {new.op} at {_where(new.location)}"


def first_difference(before: Graph, after: Graph, library: frozenset[str] = frozenset()) -> str:
    """What changed from ``before`` to ``after``, in one phrase: the first node that differs
    ("f32[8,16] → f32[12,16] aten::expand at x.py:6"), or the same IR under another hash.

    XLA_IR_DEBUG records only the innermost frame of each node, often a torch module's line
    (``linear.py:134``); so when that node was made in a file of ``library``, the first
    changed node made outside it (the user's line) is named too."""
    changed = [(old, new) for old, new in zip(before.nodes, after.nodes, strict=False) if old.key != new.key]
    if changed:
        text = _changed(*changed[0])
        if _where(changed[0][1].location).split(":")[0] in library:
            user = next(
                (
                    pair
                    for pair in changed
                    if pair[1].location and _where(pair[1].location).split(":")[0] not in library
                ),
                None,
            )
            text += f"; in your code: {_changed(*user)}" if user else ""
        return text
    if len(before.nodes) != len(after.nodes):
        extra = (after.nodes if len(after.nodes) > len(before.nodes) else before.nodes)[
            min(len(before.nodes), len(after.nodes))
        ]
        change = "more" if len(after.nodes) > len(before.nodes) else "fewer"
        return f"{change} nodes ({len(before.nodes)} → {len(after.nodes)}), from {extra.op} at {_where(extra.location)}"
    return "same IR, different parameter sequence (pytorch/xla#3604: the hash also covers device-data aliasing)"


def _common_prefix(a: Graph, b: Graph) -> int:
    count = 0
    for old, new in zip(a.nodes, b.nodes, strict=False):
        if old.op != new.op:
            break
        count += 1
    return count


def recompiles(graphs: list[Graph], library: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """One finding per graph that XLA compiled again at a sync frame that had compiled before:
    the graph, the earlier graph it is compared with and :func:`first_difference`. The earlier
    graph is the most alike at that frame (the longest run of the same ops; the nearest on a
    tie), named by the sync where its hash first compiled. A hash seen before is an in-memory
    cache hit, not a compile, and is left out."""
    seen: set[str] = set()
    found = []
    for graph in graphs:
        if graph.hash in seen:
            continue
        firsts = {g.hash: g for g in reversed(graphs[: graph.index])}  # each earlier graph where it first compiled
        earlier = sorted((g for g in firsts.values() if g.frame == graph.frame), key=lambda g: g.index)
        seen.add(graph.hash)
        if not earlier:
            continue
        nearest = max(reversed(earlier), key=lambda g: _common_prefix(g, graph))
        found.append(
            {
                "graph": graph.index,
                "hash": graph.hash,
                "sync_at": graph.frame,
                "compared_with": nearest.index,
                "compared_hash": nearest.hash,
                "change": first_difference(nearest, graph, library),
            }
        )
    return found


def _hash_key(text: str) -> str:
    return str(text).lower().removeprefix("0x")


def _steps_by_hash(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The step in which the re-run's capture saw each XLA graph hash compile (its ``compiles``
    rows), so a dumped graph can be named by the step that compiled it."""
    found: dict[str, int] = {}
    for row in rows:
        if row.get("event") == "compile" and row.get("graph_id") and row.get("step") is not None:
            found.setdefault(_hash_key(row["graph_id"]), int(row["step"]))
    return found


def spec_of(run: dict[str, Any]) -> RunSpec:
    """The run's spec, as far as the runs table keeps it, for a fresh diagnostic run. A user's
    model (``--model``, ``tpubench.bench``) is found by its stored reference, as the run's
    worker found it: its workload name (the factory's path) is in no registry."""

    def value(key: str) -> Any:
        item = run.get(key)
        return None if item is None or item != item else item  # NaN is missing

    dims = {key: int(value(key)) for key in ("seq_len", "image_size", "latent_size") if value(key) is not None}
    return RunSpec(
        suite=value("suite") or "explain",
        workload=run["workload"],
        size=run["size"],
        backend=run["backend"],
        mode=run["mode"],
        dtype=run["dtype"],
        precision=value("precision"),  # a row from before --precision: None, its dtype's plain one
        batch_size=int(run["batch_size"]),
        gen_len=int(value("gen_len") or 0),
        warmup=int(value("warmup_min_steps") or 3),
        steps=int(value("measured_steps") or 10),
        tpu_eager_mode=value("tpu_eager_mode"),
        model_ref=value("model_ref"),
        model_hash=value("model_hash"),
        **dims,
    )


def changed_model(spec: RunSpec, result: dict[str, Any]) -> str | None:
    """What to say when the re-run's user model is not the run's: its file or config changed
    since, so the diagnostics describe the model as it is now."""
    now = result.get("model_hash")
    if not spec.model_hash or not now or now == spec.model_hash:
        return None
    return (
        f"note: the model changed since the run (hash {spec.model_hash[:12]}, now {now[:12]}): "
        "the re-run measured the model as it is now"
    )


def diagnostic_env(backend: str, folder: Path) -> dict[str, str]:
    """The worker's extra environment for ``backend``'s diagnostics, all set before import torch."""
    family = backend.split("-")[0]
    env = {}
    if family == "xla":
        env.update(XLA_IR_DEBUG="1", XLA_SAVE_TENSORS_FILE=str(folder / GRAPHS_FILE), XLA_SAVE_TENSORS_FMT="text")
    if backend.endswith("-compile") or family == "tpu":
        env["TORCH_TRACE"] = str(folder / TRACE_DIR)
    if family == "tpu":
        env["TPUBENCH_TPU_DUMP_ON_MISS"] = "1"
    return env


def _rerun(spec: RunSpec, folder: Path, pythons: dict[str, str]) -> dict[str, Any]:
    from tpubench.backends import BACKENDS, get_backend
    from tpubench.launch.process import classify, run_worker, worker_env
    from tpubench.runner import python_for

    try:  # get_backend registers TPUBENCH_BACKEND_MODULES' backends as they are now, as a run does
        backend = get_backend(spec.backend)
    except KeyError:
        raise ExplainError(f"backend {spec.backend!r} is not known here; valid: {', '.join(BACKENDS)}") from None
    env = worker_env({**backend.worker_env, **diagnostic_env(spec.backend, folder)})
    outcome = run_worker(
        {"kind": "run", "spec": spec.to_json()},
        python=python_for(pythons, spec.backend),
        env=env,
        timeout_s=spec.timeout_s,
        fork=False,  # the diagnostics are read when torch is imported: a fresh interpreter
    )
    return classify(outcome, spec.timeout_s)


_ARTIFACT = re.compile(
    r'"name": "(recompile_reasons|dynamo_graph_break_reason)".*?"frame_id": (\d+), "frame_compile_id": (\d+)'
)


def trace_reasons(text: str) -> list[str]:
    """Each recompile's reasons and each graph break's reason in a ``TORCH_TRACE`` log, in order,
    with Dynamo's compile id: what tlparse shows per compile, readable without it."""
    found, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        if not (match := _ARTIFACT.search(line)):
            continue
        payload = []
        for following in lines[index + 1 :]:
            if not following.startswith("\t"):
                break
            payload.append(following.strip())
        kind, frame, attempt = match.groups()
        what = "recompiled because" if kind == "recompile_reasons" else "graph break:"
        text_ = " ".join(" ".join(payload).split())
        found.append(f"{frame}/{attempt} {what} {text_[:300]}")
    return found


def _tlparse(trace: Path, console: Console) -> dict[str, Any]:
    logs = sorted(trace.glob("*.log")) if trace.is_dir() else []
    if not logs:
        console.print(f"Dynamo: no structured trace was written under {trace}", highlight=False)
        return {"torch_trace": None}
    reasons = trace_reasons(logs[0].read_text(errors="replace"))
    for reason in reasons:
        console.print(f"Dynamo {reason}", highlight=False, markup=False)
    tool = shutil.which("tlparse")
    if tool is None:
        console.print(
            f"Dynamo: structured trace {logs[0]}; tlparse renders it as a page per compile ({TLPARSE_HINT}); "
            f"then: tlparse {logs[0]} -o {trace.parent / 'tlparse'} --no-browser",
            highlight=False,
        )
        return {"torch_trace": str(logs[0]), "reasons": reasons, "tlparse": None}
    out = trace.parent / "tlparse"
    done = subprocess.run(
        [tool, str(logs[0]), "-o", str(out), "--no-browser", "--overwrite"], capture_output=True, text=True
    )
    index = out / "index.html"
    if done.returncode != 0 or not index.exists():
        console.print(f"Dynamo: tlparse failed on {logs[0]}: {done.stderr.strip()[-300:]}", highlight=False)
        return {"torch_trace": str(logs[0]), "reasons": reasons, "tlparse": None}
    console.print(f"Dynamo: tlparse's report of every compile and graph break: {index}", highlight=False)
    return {"torch_trace": str(logs[0]), "reasons": reasons, "tlparse": str(index)}


def explain(
    results_dir: Path, run: dict[str, Any], as_json: bool, console: Console, pythons: dict[str, str] | None = None
) -> dict[str, Any]:
    """Re-run ``run``'s spec with diagnostics, print what they say, and return it."""
    import json

    spec = replace(spec_of(run), run_id=f"explain-{run['run_id']}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    folder = (Path(results_dir) / "diagnostics" / f"{run['run_id']}-{stamp}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    quiet = Console(stderr=True, markup=False) if as_json else console
    quiet.print(f"{NOT_COMPARABLE}; re-running {spec.label()} with diagnostics into {folder}", highlight=False)
    result = _rerun(spec, folder, pythons or {})
    found: dict[str, Any] = {"run_id": run["run_id"], "diagnostics": str(folder), "status": result["status"]}
    if result["status"] != "ok":
        error = " ".join(str(result.get("error") or "").split())[:300]
        raise ExplainError(f"the diagnostic re-run {result['status']}: {error}")
    if note := changed_model(spec, result):
        quiet.print(note, highlight=False)
    family = spec.backend.split("-")[0]
    if rows := result.get("compiles"):  # the re-run's own capture, as `tpubench compiles` would print it
        import pandas as pd

        from tpubench.analysis.compiles import summary
        from tpubench.schema import COMPILES

        found["summary"] = summary(pd.DataFrame(rows, columns=COMPILES.names), spec.steps)
        for line in found["summary"]:
            quiet.print(f"re-run: {line}", highlight=False, markup=False)
    if family == "xla":
        dumps = sorted(folder.glob(f"{GRAPHS_FILE}*"))
        graphs = parse_graphs("".join(path.read_text() for path in dumps))
        found["graphs"] = len(graphs)
        found["recompiles"] = recompiles(graphs, library_files())
        steps = _steps_by_hash(result.get("compiles") or [])
        for item in found["recompiles"]:
            item["step"] = steps.get(_hash_key(item["hash"]))
        quiet.print(
            f"XLA: {len(graphs)} synced graphs, {len({g.hash for g in graphs})} distinct; "
            f"{len(found['recompiles'])} recompiled at a sync line that had compiled before:",
            highlight=False,
        )
        for item in found["recompiles"]:
            when = f"step {item['step']}, " if item["step"] is not None else ""
            sync = item["sync_at"] or "tpubench's step end"
            quiet.print(
                f"  graph {item['graph']} ({when}{item['hash'][:12]}, sync at {sync}) vs graph "
                f"{item['compared_with']}: {item['change']}",
                highlight=False,
                markup=False,
            )
    if spec.backend.endswith("-compile") or family == "tpu":
        found.update(_tlparse(folder / TRACE_DIR, quiet))
    if family == "tpu":
        quiet.print(
            "TorchTPU: dump-on-miss was asked for (torch.tpu._set_dump_on_cache_miss); where it writes, and the "
            "trace events, are read from the torch_tpu 0.2.0 wheel and not verified on a chip",
            highlight=False,
        )
    if as_json:
        print(json.dumps(found, indent=1))
    return found
