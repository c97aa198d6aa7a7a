"""TorchTPU backends on a host with no TPU chip, with torch_tpu really installed.

What can run here runs for real: detection, unavailable rows, the library's own abort when
a worker forces the runtime up, the (zero) compile counters, and autoload hygiene. The
TPU execution path itself needs a chip and is not exercised (nothing is faked for it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT, tpubench

from tpubench.backends.tpu import find_tcmalloc, tpu_pci_devices
from tpubench.runner import SuiteRunner, plan

pytestmark = [
    # find_spec, not importorskip: importing torch_tpu would change this process's torch
    pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is None, reason="install the [tpu] extra"),
    pytest.mark.skipif(bool(tpu_pci_devices()), reason="these tests are about a host without a TPU chip"),
]


def test_env_reports_tpu_unavailable_with_the_reason() -> None:
    result = tpubench("env", "--json")
    assert result.returncode == 0, result.stderr
    backends = json.loads(result.stdout)["backends"]
    for name in ("tpu", "tpu-compile"):
        assert backends[name]["available"] is False
        assert backends[name]["reason"] == "no TPU chip on this host"
        # what is installed still shows, from package metadata
        assert backends[name]["versions"]["torch_tpu"] == importlib.metadata.version("torch_tpu")
        assert backends[name]["versions"]["libtpu"] == importlib.metadata.version("libtpu")


def test_interpreter_without_torch_tpu_says_so(results_dir: Path, tmp_path: Path) -> None:
    bare_venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(bare_venv)], check=True)
    # a venv layered on the system Python: torch_tpu is not importable there
    [row] = SuiteRunner(results_dir, pythons={"tpu": str(bare_venv / "bin" / "python")}).run(
        plan(["gpt2"], backends=["tpu"], modes=["infer"], steps=1)
    )
    assert row["status"] == "unavailable"
    assert "torch_tpu not installed" in row["error"] or "probe with" in row["error"]


def test_tpu_rows_are_unavailable_and_the_suite_goes_on(results_dir: Path) -> None:
    result = tpubench(
        "run --workload gpt2 --backend tpu --backend cpu --mode infer --steps 2 --tpu-eager-mode defer_and_fuse "
        "--results",
        str(results_dir),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    from tpubench import store

    runs = store.load_runs(results_dir).set_index("backend")
    assert runs.loc["tpu", "status"] == "unavailable" and runs.loc["tpu", "error"] == "no TPU chip on this host"
    assert runs.loc["cpu", "status"] == "ok"


def test_tpu_rows_record_the_chip_pinning_and_the_allocator_preload(
    results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the row's ``env`` fingerprint, from the worker environment the parent builds."""
    monkeypatch.delenv("TPU_VISIBLE_CHIPS", raising=False)
    [row] = SuiteRunner(results_dir).run(plan(["gpt2"], backends=["tpu"], modes=["infer"], steps=1))
    env = json.loads(row["env"])
    assert {k: env[k] for k in ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS")} == {
        "TPU_VISIBLE_CHIPS": "0",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
    }
    assert (find_tcmalloc() or "no tcmalloc") in env.get("LD_PRELOAD", "no tcmalloc")


def test_forcing_the_runtime_without_a_chip_is_a_crashed_row(fault_workloads: None, results_dir: Path) -> None:
    """The abort comes from TorchTPU itself; its neighbours in the suite are unaffected."""
    names = ["fault-ok", "tpu-force-init", "fault-ok"]
    specs = plan(names, modes=["infer"], warmup=1, steps=2, timeout_s=120)
    rows = SuiteRunner(results_dir).run(specs)
    assert [row["status"] for row in rows] == ["ok", "crashed", "ok"]
    crashed = rows[1]
    assert "SIGABRT" in crashed["error"]
    assert "TPU initialization failed" in crashed["stderr_tail"]


CACHE_STATS = textwrap.dedent("""
    import json, types, warnings
    import torch
    from tpubench.backends.tpu import tpu_cache_stats
    real = tpu_cache_stats()
    torch.tpu = types.ModuleType("torch.tpu")  # a fake older torch_tpu without the private API
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        missing = tpu_cache_stats()
    print(json.dumps({"real": real, "missing": missing, "warning": str(caught[0].message)}))
""")


def test_compile_statistics_reader_real_zeros_and_null_when_missing() -> None:
    """Runs with autoload on, as a TPU worker does; the 'older version' is a module without the API."""
    result = subprocess.run(
        [sys.executable, "-c", CACHE_STATS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
            "TPU_SKIP_MDS_QUERY": "1",
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["real"] == {"num_compilations": 0, "num_cache_reqs": 0, "num_cache_hits": 0}
    assert report["missing"] is None and "_get_cache_stats is missing" in report["warning"]


def test_cpu_workers_are_untouched_by_an_installed_torch_tpu(
    fault_workloads: None, results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report_path = tmp_path / "report.json"
    monkeypatch.setenv("TPUBENCH_TEST_REPORT", str(report_path))
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")  # even if the user's shell turns autoload on
    specs = plan(["env-report"], modes=["infer"], steps=1)
    [row] = SuiteRunner(results_dir).run(specs)
    assert row["status"] == "ok", row.get("stderr_tail")
    report = json.loads(report_path.read_text())
    pristine = subprocess.run(  # torch's own defaults, from a process where torch_tpu cannot load
        [sys.executable, "-c", PRISTINE],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    ).stdout
    expected = {"autoload": "0", **json.loads(pristine), "has_torch_tpu_module": False, "tpu_compile_backend": False}
    assert report == expected


def test_a_ray_actor_never_imports_torch_and_turns_plugin_autoload_off() -> None:
    """A Ray actor plays the parent's part for its runs, in an environment Ray gave it, where
    autoload is not turned off. What it runs of tpubench (the runner, the backends' declarations)
    imports no torch, so its fork server's boot has the CPU to itself and no TPU plugin can load
    in the actor and take the chip from a run's own worker; importing tpubench.launchers also
    turns autoload off, for whatever else the process imports."""
    code = (
        "import os, sys, tpubench.launchers.ray_actor, tpubench.runner; "
        "from tpubench.backends import get_backend; "
        "[get_backend(name).worker_env for name in ('cpu', 'cuda', 'tpu', 'xla')]; "
        "print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], 'torch' in sys.modules, 'torch_tpu' in sys.modules)"
    )
    env = {key: value for key, value in os.environ.items() if key != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0", "False", "False"]


PRISTINE = (
    "import json, torch._dynamo as d; "
    "print(json.dumps({'allow_rnn': d.config.allow_rnn, "
    "'trace_autograd_ops': getattr(d.config, 'trace_autograd_ops', None)}))"
)


MINE = """
import torch


def make_model():
    return torch.nn.Linear(4, 2)


def make_inputs(batch_size, generator, **dims):
    return (torch.randn(batch_size, 4, generator=generator),)
"""

#: ``tpubench.bench`` in a user's script, up to its planning (``devices=[0]`` is refused
#: there, after the model is resolved, so no run starts): what its process holds then
API_CALL = """
import os, sys, warnings
import tpubench
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        tpubench.bench("mine.py:make_model", "mine.py:make_inputs", devices=[0])
    except ValueError:
        pass
said = any("torch_tpu was loaded into this process" in str(w.message) for w in caught)
print("torch" in sys.modules, "torch_tpu" in sys.modules, os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
      os.environ.get("TPU_SKIP_MDS_QUERY"), said)
"""


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        # the API imports torch with autoload off, and gives the user's environment back
        ("", ["True", "False", "None", "None", "False"]),
        # the user's `import torch` loaded it first (its loader leaves the variable at 1): the dry run
        # keeps off the metadata server, and the user is told
        ("import torch\n", ["True", "True", "1", "1", "True"]),
    ],
)
def test_the_python_api_keeps_torch_tpu_out_of_the_users_process(tmp_path: Path, first: str, expected: list) -> None:
    """torch_tpu's entry point autoloads it with ``import torch``; in a user's process on a host
    without a chip, the model's dry run (a backward) then polled the metadata server for minutes."""
    (tmp_path / "mine.py").write_text(MINE)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "TPU_SKIP_MDS_QUERY")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", first + API_CALL], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == expected
