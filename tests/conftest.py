"""Shared fixtures: the test-only fault workloads and a fresh results directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Like the CLI's parent process: an installed torch_tpu must not load into the test process.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def session_device_locks(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Device locks of this test session only: another tpubench on the host must not make
    the tests wait (the lock tests set their own directory)."""
    os.environ["TPUBENCH_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))


@pytest.fixture
def fault_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register tests/fault_workloads.py in this process and in every worker it starts."""
    monkeypatch.setenv("TPUBENCH_WORKLOAD_MODULES", "fault_workloads")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(TESTS_DIR))


@pytest.fixture
def shape_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register tests/shape_workloads.py (an image and a latent workload) here and in every worker."""
    monkeypatch.setenv("TPUBENCH_WORKLOAD_MODULES", "shape_workloads")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(TESTS_DIR))


@pytest.fixture
def fault_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register tests/fault_backends.py (a deliberately wrong backend) here and in every worker."""
    monkeypatch.setenv("TPUBENCH_BACKEND_MODULES", "fault_backends")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(TESTS_DIR))


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    path = tmp_path / "results"
    path.mkdir()
    return path


@pytest.fixture
def xla_python(monkeypatch: pytest.MonkeyPatch) -> str:
    """The interpreter of the torch_xla environment (TPUBENCH_XLA_PYTHON), on the PJRT CPU device.

    torch_xla pins torch 2.9.0, so it lives in its own venv; .ci/run builds it and sets the
    variable. Without it the XLA tests skip.
    """
    python = os.environ.get("TPUBENCH_XLA_PYTHON")
    if not python or not os.access(python, os.X_OK):
        pytest.skip("TPUBENCH_XLA_PYTHON does not name a torch_xla interpreter (see .ci/run)")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    return python


@pytest.fixture
def compile_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register tests/compile_workloads.py (workloads that recompile, break graphs, fall back,
    and the cheap ``cpu-compile-eager`` backend) here and in every worker."""
    monkeypatch.setenv("TPUBENCH_WORKLOAD_MODULES", "compile_workloads")
    monkeypatch.setenv("TPUBENCH_BACKEND_MODULES", "compile_workloads")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(TESTS_DIR))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Two things for CI's ``pytest -n 2`` (``--dist loadgroup``, pyproject's addopts):

    - the tests that use a module-scoped fixture (a store written by real runs, a server) go
      to one xdist worker together, which builds the fixture once; spread over both workers,
      as ``--dist load`` spreads a module's tests, each worker built its own copy;
    - the ``slow`` tests come first, so that the workers' last tests are short ones and
      neither waits long for the other at the end.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise as collected
