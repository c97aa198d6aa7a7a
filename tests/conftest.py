"""Shared fixtures: the test-only fault workloads and a fresh results directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Like the CLI's parent process: an installed torch_tpu must not load into the test process.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# The CLI's piped output is drawn to COLUMNS when it is set, and the CLIs the tests start are
# piped: a COLUMNS the test process inherits at C level (80 here, absent from os.environ but
# passed to every child) would squeeze them. They are drawn at the piped default, as in CI's logs;
# the width tests pass their own COLUMNS.
os.environ["COLUMNS"] = "200"

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def session_locks_and_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Device locks and a cache of this test session only: another tpubench on the host must
    not make the tests wait (the lock tests set their own directory), and no test writes to
    the user's ~/.cache."""
    os.environ["TPUBENCH_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    os.environ["TPUBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))  # tpubench list's counts


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


#: the test modules that define a module-scoped fixture (a store written by real runs, a server)
SHARED_FIXTURE_MODULES = {path.name for path in TESTS_DIR.glob("test_*.py") if 'scope="module"' in path.read_text()}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """CI's ``pytest -n 2``: xdist's default (``--dist load``) hands out chunks of consecutive
    tests, so the tests of a module with a module-scoped fixture can land on both workers, and
    each builds its own copy (the dashboard's store of real runs took 76 s; test_ops' profiled
    cpu, cpu-compile and xla runs; test_xla's verified run; test_regression_cli's and
    test_shapes' stores). Here such a module's tests are one unit of work, which one worker
    runs, building the fixture once; xdist sends the largest units first
    (``--loadscope-reorder``, its default), then every other test on its own. Overriding
    ``_split_scope`` is how xdist's own loadfile and loadgroup schedulers define their units.
    Another ``--dist`` is left as it is.

    (``--dist loadgroup`` with ``xdist_group`` marks would say the same, but xdist 3.8 groups
    by rewriting ``Item._nodeid``, which pytest 9 no longer reads: the marks had no effect.)
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module.rsplit("/", 1)[-1] in SHARED_FIXTURE_MODULES else nodeid

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tests first: xdist hands tests out in this order after the units above,
    so the workers' last tests are short ones and neither waits long for the other at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise as collected


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files each read of a store opens, from now on (every read goes through store.scan_files)."""
    from tpubench import store

    seen: list[str] = []
    original = store.scan_files

    def counting(location, table, paths, *args, **kwargs):
        seen.extend(paths)
        return original(location, table, paths, *args, **kwargs)

    monkeypatch.setattr(store, "scan_files", counting)
    return seen
