"""What a first run on a TPU VM depends on, decided here without a chip.

Only the chip is faked: the (free, total) tuples are the ones TorchTPU 0.2.0's
``TpuAllocator::getMemoryInfo`` returns, the busy messages are libtpu's own, and a chip's
VFIO group is a file that a real second process holds open. What needs a chip (the runtime
honouring the pinning and cache variables) is listed in docs/install-and-backends.md, "Setup on
a TPU VM".
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpubench.backends.cpu import CpuBackend
from tpubench.backends.tpu import (
    TpuBackend,
    chip_holder,
    compile_cache_env,
    find_tcmalloc,
    free_memory_bytes,
    run_when_chip_free,
    tcmalloc_env,
    wait_for_chip,
)
from tpubench.fingerprint import perf_env
from tpubench.spec import RunSpec
from tpubench.worker import admit
from workloads import get_workload

GIB = 2**30
needs_torch_tpu = pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is None, reason="install the [tpu] extra")


class ChipMemory(CpuBackend):
    """The cpu backend with the memory answer of a TPU chip: the only fake here."""

    def __init__(self, info: tuple[int, int]):
        self.info = info

    def memory_capacity_bytes(self) -> int | None:
        return free_memory_bytes(self.info)


def admitted(info: tuple[int, int], size: str, mode: str, batch_size: int = 8) -> dict:
    workload = get_workload("llama3")
    spec = RunSpec(
        suite="llm",
        workload="llama3",
        size=size,
        backend="tpu",
        mode=mode,
        dtype="bfloat16",
        batch_size=batch_size,
        seq_len=1024,
    )
    return admit(spec, ChipMemory(info), "TPU v5e", workload, workload.config(size))


def test_unknown_tpu_memory_admits_the_run_and_a_known_limit_still_skips() -> None:
    in_use = 2 * GIB
    assert free_memory_bytes((0, 0)) is None  # the allocator's stats could not be read
    assert free_memory_bytes((-in_use, 0)) is None  # the runtime reports no limit
    assert free_memory_bytes((16 * GIB - in_use, 16 * GIB)) == 14 * GIB
    for unknown in ((0, 0), (-in_use, 0)):
        assert "status" not in admitted(unknown, "8b", "train")
    assert "status" not in admitted((16 * GIB - in_use, 16 * GIB), "1b", "infer", batch_size=1)
    skipped = admitted((16 * GIB - in_use, 16 * GIB), "8b", "train")
    assert skipped["status"] == "skipped" and "exceeds the 14.0 GiB available on TPU v5e" in skipped["error"]


HOLDER = """
import sys
group = open(sys.argv[1], "r+")  # opened for writing, as a TPU process holds its chip's VFIO group
print("holding", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def group(tmp_path: Path) -> Path:
    path = tmp_path / "dev/vfio/0"
    path.parent.mkdir(parents=True)
    path.touch()
    return path


def hold(group: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(group)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


def test_the_wait_ends_when_the_process_holding_the_chip_lets_go(group: Path) -> None:
    assert wait_for_chip([group], lambda message: pytest.fail(message)) == 0.0  # free: no wait
    holder = hold(group)
    heard = []

    def release(message: str) -> None:
        heard.append(message)
        assert holder.stdin is not None
        holder.stdin.close()  # the holder exits, as a killed worker eventually does

    waited = wait_for_chip([group], release)
    assert holder.wait() == 0
    assert heard == [f"waiting for the TPU chip: process {holder.pid} has {os.path.realpath(group)} open"]
    assert waited > 0 and chip_holder([group]) is None


def test_a_chip_held_for_good_is_waited_for_at_most_the_limit(group: Path) -> None:
    holder = hold(group)
    try:
        waited = wait_for_chip([group], lambda message: None, limit_s=0.3)
        assert 0.3 <= waited < 5
        assert chip_holder([group]) == f"process {holder.pid} has {os.path.realpath(group)} open"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()


#: libtpu's messages for a held chip: the VFIO group's EBUSY, and its host-wide lockfile
VFIO_BUSY = (
    "RuntimeError: TPU initialization failed: open(/dev/vfio/0): Device or resource busy: "
    "Device or resource busy; Couldn't open iommu group /dev/vfio/0"
)
LOCKFILE_BUSY = "The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in this process."


def starts(*rows: dict) -> tuple[list[dict], object]:
    """A worker start that returns ``rows`` in turn (the rows classify() makes of its outcomes)."""
    started: list[dict] = []

    def start() -> dict:
        started.append(rows[len(started)])
        return dict(started[-1])

    return started, start


def test_a_worker_that_found_the_chip_busy_is_started_once_more(group: Path) -> None:
    for busy in (
        {"status": "failed", "error": VFIO_BUSY},
        {"status": "crashed", "error": "worker killed by SIGABRT", "stderr_tail": LOCKFILE_BUSY},
    ):
        started, start = starts(busy, {"status": "ok", "warnings": None})
        row = run_when_chip_free([group], start, lambda message: None)
        assert len(started) == 2 and row["status"] == "ok" and row["chip_wait_s"] == 0.0
        assert row["warnings"].startswith(f"the TPU chip was busy at the first start ({busy['error']})")


def test_other_failures_and_a_second_busy_chip_are_not_retried(group: Path) -> None:
    started, start = starts({"status": "failed", "error": "RuntimeError: shapes do not match"})
    assert run_when_chip_free([group], start, lambda message: None)["status"] == "failed" and len(started) == 1
    busy = {"status": "failed", "error": VFIO_BUSY}
    started, start = starts(busy, busy)
    assert run_when_chip_free([group], start, lambda message: None)["error"] == VFIO_BUSY and len(started) == 2


def test_tcmalloc_is_preloaded_unless_absent_or_already_there() -> None:
    library = "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    assert tcmalloc_env({}, library) == {"LD_PRELOAD": library}
    assert tcmalloc_env({"LD_PRELOAD": "/opt/libfoo.so"}, library) == {"LD_PRELOAD": f"/opt/libfoo.so:{library}"}
    assert tcmalloc_env({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, library) == {}
    assert tcmalloc_env({}, None) == {}
    assert perf_env({"LD_PRELOAD": library, "HOME": "/root"}) == {"LD_PRELOAD": library}


@needs_torch_tpu
@pytest.mark.skipif(find_tcmalloc() is None, reason="no tcmalloc on this host (apt install libtcmalloc-minimal4)")
def test_torch_tpus_own_tcmalloc_check_passes_in_a_tpu_worker_environment() -> None:
    """torch_tpu checks at import whether tcmalloc is the process allocator; it no longer warns."""
    marker = "<TorchTpu/Performance/TcMalloc/>"
    env = {"PATH": os.environ["PATH"], **TpuBackend().worker_env}
    assert env["LD_PRELOAD"] == find_tcmalloc()

    def import_torch(env: dict[str, str]) -> str:
        result = subprocess.run(
            [sys.executable, "-W", "always", "-c", "import torch"], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stderr

    assert marker not in import_torch(env)
    assert marker in import_torch({key: value for key, value in env.items() if key != "LD_PRELOAD"})


def test_compile_cache_reaches_torchtpu_and_runs_without_one_start_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert compile_cache_env(None) == {"TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled"}
    monkeypatch.chdir(tmp_path)
    shared = compile_cache_env("cache")
    assert shared["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == str(tmp_path / "cache" / "tpu")
    assert shared == compile_cache_env(str(tmp_path / "cache"))  # one DIR, one cache, however it is named
    other = compile_cache_env("other")["TORCH_TPU_TIER2_COMPILATION_CACHE"]
    assert other != shared["TORCH_TPU_TIER2_COMPILATION_CACHE"]  # a new DIR does not see the old shm tier
    for name in shared:  # setup() writes the worker's environment; restore this process's afterwards
        monkeypatch.setenv(name, "")
    spec = RunSpec("llm", "gpt2", "tiny", "tpu", "infer", "float32", batch_size=1, seq_len=8, compile_cache="cache")
    TpuBackend().setup(spec)
    assert {name: os.environ[name] for name in shared} == shared


EAGER_DEFAULT = "import torch; print(torch.tpu.eager_mode.name)"


@needs_torch_tpu
def test_the_default_eager_mode_is_torchtpus_own() -> None:
    """What a user's plain eager PyTorch gets on TorchTPU; read from a fresh process (no chip needed)."""
    result = subprocess.run(
        [sys.executable, "-c", EAGER_DEFAULT],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ["PATH"], "TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "TPU_SKIP_MDS_QUERY": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1].lower() == TpuBackend.eager_mode
