"""The import direction: from the CLI down to the data (docs/architecture.md).

``lint-imports`` checks pyproject.toml's layers contract; these tests check that it passes on
the tree, that it would catch a backend reaching up to the worker (a lazy import inside a
function included), and that no import loop is left among the project's packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
from helpers import ROOT

PACKAGES = ("tpubench", "workloads", "reports", "dashboard")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_layers_contract_is_kept():
    checked = lint_imports(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 kept, 0 broken" in checked.stdout


def test_a_backend_that_imports_the_worker_breaks_the_contract(tmp_path: Path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "tpubench" / "backends" / "cpu.py", "a") as module:
        module.write("\n\ndef reach_up() -> None:\n    from tpubench import worker  # noqa: F401\n")
    checked = lint_imports(tmp_path)
    assert checked.returncode != 0
    assert "tpubench.backends.cpu -> tpubench.worker" in checked.stdout


def import_loops(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                loops.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return loops


def test_no_import_loop_remains_lazy_imports_included():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    assert "tpubench.worker" in graph.find_modules_directly_imported_by("tpubench.launch.serve")
    assert import_loops(graph) == []


def test_the_loop_finder_sees_a_loop():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="a")
    graph.add_import(importer="b", imported="c")
    assert import_loops(graph) == [{"a", "b"}]
