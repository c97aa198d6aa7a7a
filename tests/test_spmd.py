"""Multi-device runs of the xla family: one process over N PJRT devices with GSPMD.

The layout (which parameter gets which partition spec, the mesh, the worker's environment)
is checked here without torch_xla. The rest runs real torch_xla on PJRT CPU's virtual
devices (``CPU_NUM_DEVICES=N``, fixture ``xla_python``): N devices must give the one-device
losses, the partitioned HLO must hold the collectives each plan implies, and a run through
the Executor must give an ``ok`` row. No TPU is faked beyond a sysfs tree for the pinning
environment (as tests/test_tpu_detection.py does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import ROOT
from test_tpu_detection import add_pci_device, v7_host

from tpubench.backends.base import Availability
from tpubench.backends.tpu import GOOGLE_PCI_VENDOR, PIN_DEFAULTS
from tpubench.backends.xla import SPMD_MEMORY_NOTE, XlaBackend, tpu_subset_env
from tpubench.launch.zygote import Zygote
from tpubench.parallel.spmd import input_spec, mesh_shape, partition_specs
from tpubench.runner import Executor, SuiteRunner, plan
from tpubench.spec import RunSpec
from workloads import ParallelPlan, build, get_workload

TESTS_DIR = Path(__file__).resolve().parent
#: the workloads with a tensor-parallel plan (their own, as every backend uses it)
PLANNED = ("gpt2", "llama3")


def spec(parallel: str, devices: int, tp: int = 1) -> RunSpec:
    return RunSpec(
        "llm", "gpt2", "tiny", "xla", "train", "float32", 4, 32, devices=devices, parallel=parallel, tp_size=tp
    )


def gpt2_specs(parallel: str, dp: int, tp: int) -> dict:
    instance = build(get_workload("gpt2"), "tiny", batch_size=4, seq_len=32)
    return partition_specs(instance.model, instance.workload.parallel, parallel, dp, tp)


def test_each_plan_has_its_mesh() -> None:
    assert mesh_shape(spec("dp", 4)) == mesh_shape(spec("fsdp", 4)) == (4, 1)
    assert mesh_shape(spec("tp", 4, tp=4)) == (1, 4)
    assert mesh_shape(spec("fsdp_tp", 8, tp=2)) == (4, 2)


def test_dp_replicates_every_weight_and_fsdp_shards_every_parameter_once() -> None:
    assert gpt2_specs("dp", 2, 1) == {}
    fsdp = gpt2_specs("fsdp", 2, 1)
    model = build(get_workload("gpt2"), "tiny").model
    assert set(fsdp) == {name for name, _ in model.named_parameters()}  # units and root: all of them
    assert "lm_head.weight" not in fsdp  # tied to the token embedding: one parameter, annotated once
    assert fsdp["token_embedding.weight"] == ("fsdp", None) and fsdp["blocks.0.ln_1.bias"] == ("fsdp",)
    # a dim 0 the degree does not divide stays replicated rather than padded
    assert "blocks.0.ln_1.bias" not in gpt2_specs("fsdp", 3, 1)


def test_tp_splits_the_plans_linears_megatron_style() -> None:
    tp = gpt2_specs("tp", 1, 2)
    assert tp["blocks.1.q.weight"] == tp["blocks.1.mlp.0.weight"] == ("tp", None)  # colwise: output features
    assert tp["blocks.1.q.bias"] == ("tp",)
    assert tp["blocks.1.proj.weight"] == tp["blocks.1.mlp.2.weight"] == (None, "tp")  # rowwise: input features
    assert "blocks.1.proj.bias" not in tp and "token_embedding.weight" not in tp  # added after the reduction
    two_d = gpt2_specs("fsdp_tp", 2, 2)
    assert two_d["blocks.0.q.weight"] == ("tp", "fsdp") and two_d["blocks.0.proj.weight"] == ("fsdp", "tp")
    assert two_d["blocks.0.proj.bias"] == two_d["ln_f.weight"] == ("fsdp",)  # the rest: fsdp alone


def test_a_plan_that_does_not_fit_the_model_is_an_error_not_a_replicated_run() -> None:
    model = build(get_workload("gpt2"), "tiny").model
    with pytest.raises(ValueError, match=r"'blocks\.\*\.attention\.q' names no module"):
        partition_specs(model, ParallelPlan(tp={"blocks.*.attention.q": "colwise"}), "tp", 1, 2)
    with pytest.raises(ValueError, match=r"names blocks\.0\.ln_1, a LayerNorm"):
        partition_specs(model, ParallelPlan(tp={"blocks.*.ln_1": "colwise"}), "tp", 1, 2)
    with pytest.raises(ValueError, match="valid: colwise, rowwise"):
        partition_specs(model, ParallelPlan(tp={"blocks.*.q": "diagonal"}), "tp", 1, 2)
    with pytest.raises(ValueError, match="needs the workload's tensor-parallel plan"):
        partition_specs(model, None, "fsdp_tp", 1, 2)


def test_the_batch_splits_on_the_data_parallel_axis_only() -> None:
    import torch

    tokens = torch.zeros(4, 32, dtype=torch.long)
    assert input_spec(tokens, 2) == ("fsdp", None) and input_spec(tokens, 1) is None
    with pytest.raises(ValueError, match="global batch of 4 does not split over 3"):
        input_spec(tokens, 3)


def test_pjrt_cpu_runs_get_n_virtual_devices_and_are_marked_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    backend = XlaBackend()
    assert backend.worker_env_for(spec("dp", 4))["CPU_NUM_DEVICES"] == "4"
    assert "CPU_NUM_DEVICES" not in backend.worker_env_for(spec("none", 1))
    assert backend.simulated_devices()
    monkeypatch.delenv("TPUBENCH_SIMULATED_DEVICES", raising=False)
    assert backend._parallel_devices(1) == 8
    monkeypatch.setenv("TPUBENCH_SIMULATED_DEVICES", "3")
    assert backend._parallel_devices(1) == 3
    assert Availability(True).parallel_devices == 1  # a backend that says nothing runs one device


def test_a_tpu_run_is_pinned_to_its_chips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subset variables are read from vLLM's TPU backend and pytorch/xla#7714, not checked on a chip."""
    for name in PIN_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    for chip in range(8):
        add_pci_device(tmp_path / "v5e", f"0000:00:{4 + chip:02x}.0", GOOGLE_PCI_VENDOR, "0x0063", chip)
    v7_host(tmp_path / "v7")
    backend = XlaBackend()
    backend.root = tmp_path / "v5e"
    assert not backend.simulated_devices()
    assert backend.worker_env_for(spec("dp", 1))["TPU_VISIBLE_CHIPS"] == "0"  # one chip, as before
    four = backend.worker_env_for(spec("fsdp", 4))
    assert (four["TPU_VISIBLE_CHIPS"], four["TPU_CHIPS_PER_PROCESS_BOUNDS"], four["TPU_PROCESS_BOUNDS"]) == (
        "0,1,2,3",
        "2,2,1",
        "1,1,1",
    )
    assert backend._parallel_devices(1) == 8  # the probe sees its pinned chip; the host has 8
    backend.root = tmp_path / "v7"  # two devices per chip: 4 devices are 2 chips
    assert backend.worker_env_for(spec("dp", 4))["TPU_VISIBLE_CHIPS"] == "0,1"
    assert tpu_subset_env({"TPU_VISIBLE_CHIPS": "4,5"}, 2)["TPU_VISIBLE_CHIPS"] == "4,5"  # the user's choice
    assert tpu_subset_env({"TPU_VISIBLE_CHIPS": "4"}, 2)["TPU_VISIBLE_CHIPS"] == "4"  # fewer stay fewer, as for CUDA


# --- real torch_xla on PJRT CPU --------------------------------------------------------------


def spmd_outputs(python: str, workload: str, parallel: str, devices: int, tp: int, dump: Path, *options: str) -> dict:
    """tests/spmd_outputs.py in the torch_xla interpreter, with the optimised HLO dumped to ``dump``."""
    env = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(ROOT)]),
    }
    result = subprocess.run(
        [python, str(TESTS_DIR / "spmd_outputs.py"), workload, parallel, str(devices), str(tp), *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["devices"] == devices
    return found


def collectives(dump: Path) -> set[str]:
    """The collective opcodes in the partitioned, optimised HLO of every graph in ``dump``."""
    text = "".join(path.read_text() for path in dump.glob("*after_optimizations.txt"))
    assert text, f"no optimised HLO dumped in {dump}"
    return {op for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all") if f"{op}(" in text}


@pytest.fixture(scope="module")
def one_device() -> dict:
    """Each workload's outputs on one xla device (no SPMD), computed once per module."""
    return {}


def baseline(one_device: dict, python: str, workload: str, tmp: Path, *options: str) -> dict:
    key = (workload, *options)
    if key not in one_device:
        one_device[key] = spmd_outputs(python, workload, "none", 1, 1, tmp / "one", *options)
        assert collectives(tmp / "one") == set()
    return one_device[key]


def assert_same_losses(found: list[float], expected: list[float]) -> None:
    assert len(found) == len(expected) == 3
    assert found == pytest.approx(expected, rel=1e-5)
    assert expected[0] > expected[-1]  # it trains: the comparison is over changing weights


@pytest.mark.slow
def test_fsdp_over_two_devices_gives_the_one_device_losses_with_gathers_and_reductions(
    xla_python: str, tmp_path: Path, one_device: dict
) -> None:
    found = spmd_outputs(xla_python, "gpt2", "fsdp", 2, 1, tmp_path / "fsdp2")
    assert_same_losses(found["losses"], baseline(one_device, xla_python, "gpt2", tmp_path)["losses"])
    assert found["shardings"]["blocks.0.mlp.0.weight"] == "{devices=[2,1]0,1}"
    assert {"all-gather", "all-reduce"} <= collectives(tmp_path / "fsdp2")  # weights gathered, gradients reduced


#: the collectives each plan must make XLA insert (XLA:CPU reduces FSDP gradients with
#: all-reduce, not reduce-scatter: no test requires one)
EXPECTED = {"dp": {"all-reduce"}, "fsdp": {"all-gather", "all-reduce"}, "tp": {"all-reduce"}}


@pytest.mark.nightly
@pytest.mark.parametrize("workload", PLANNED)
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("parallel", ["dp", "fsdp", "tp", "fsdp_tp"])
def test_every_plan_over_n_devices_gives_the_one_device_losses(
    xla_python: str, tmp_path: Path, one_device: dict, workload: str, devices: int, parallel: str
) -> None:
    tp = {"tp": devices, "fsdp_tp": 2}.get(parallel, 1)
    found = spmd_outputs(xla_python, workload, parallel, devices, tp, tmp_path / "n")
    assert_same_losses(found["losses"], baseline(one_device, xla_python, workload, tmp_path)["losses"])
    expected = EXPECTED.get(parallel) or ({"all-gather", "all-reduce"} if devices // tp > 1 else {"all-reduce"})
    assert expected <= collectives(tmp_path / "n")


@pytest.mark.nightly
def test_xla_compile_runs_the_2d_plan_with_the_one_device_losses(
    xla_python: str, tmp_path: Path, one_device: dict
) -> None:
    """Dynamo's openxla bridge keeps the shardings marked on the parameters and the batch."""
    found = spmd_outputs(xla_python, "gpt2", "fsdp_tp", 4, 2, tmp_path / "n", "--backend", "xla-compile")
    assert_same_losses(found["losses"], baseline(one_device, xla_python, "gpt2", tmp_path)["losses"])
    assert found["shardings"]["blocks.0.q.weight"] == "{devices=[2,2]0,2,1,3}"  # dim 0 on tp, dim 1 on fsdp
    assert {"all-gather", "all-reduce"} <= collectives(tmp_path / "n")


@pytest.mark.nightly
@pytest.mark.parametrize("workload", PLANNED)
def test_tensor_parallel_decoding_gives_the_one_device_tokens(
    xla_python: str, tmp_path: Path, one_device: dict, workload: str
) -> None:
    """The serving comparison's case: greedy tokens through a KV cache the partitioner places."""
    found = spmd_outputs(xla_python, workload, "tp", 2, 2, tmp_path / "n", "--decode")
    assert found["tokens"] == baseline(one_device, xla_python, workload, tmp_path, "--decode")["tokens"]
    assert "all-reduce" in collectives(tmp_path / "n")


# nightly (77 s on the 2-core CI host: three workers, two SPMD compiles); in CI, the profiled
# run below takes the same way (the executor, a forked xla worker on N virtual devices, dp),
# and test_xla.py's test_verify_xla_against_the_cpu_reference verifies an xla run
@pytest.mark.nightly
def test_a_verified_dp_run_through_the_executor_is_ok_on_two_forked_virtual_devices(
    results_dir: Path, xla_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked: list[tuple[str, str | None]] = []  # (request kind, CPU_NUM_DEVICES) of each worker forked
    start = Zygote.start

    def recording_start(self: Zygote, request: dict, env: dict[str, str], scratch: str, fds: list[int]) -> int:
        pid = start(self, request, env, scratch, fds)
        forked.append((request["kind"], env.get("CPU_NUM_DEVICES")))
        return pid

    monkeypatch.setattr(Zygote, "start", recording_start)
    [one] = plan(["gpt2"], backends=["xla"], modes=["train"], batch_size=4, seq_len=32, warmup=1, steps=2)
    two = replace(one, devices=2, parallel="dp", scaling="strong", timeout_s=300, verify=True)
    [row] = SuiteRunner(results_dir, pythons={"xla": xla_python}).run([two])
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    assert (row["devices"], row["parallel"], row["device"]) == (2, "dp", "CPU (PJRT)")
    # --verify's candidate ran sharded over 2 devices too: its losses are the cpu reference's
    assert row["verified"] == "match" and row["max_rel_err"] < 1e-5
    assert row["peak_mem_bytes"] is None and SPMD_MEMORY_NOTE in row["warnings"]
    assert row["recompiles_after_warmup"] == 0 and row["measured_steps"] == 2
    # both xla workers forked from a fork server (which never imports torch_xla): PJRT read
    # CPU_NUM_DEVICES in the child
    assert forked.count(("run", "2")) == forked.count(("verify", "2")) == 1


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("tpubench.traces.collectives") is None, reason="needs the per-device trace reader"
)
def test_a_profiled_spmd_run_has_per_device_ops_rows_and_its_collective_time(xla_python: str, tmp_path: Path) -> None:
    """4 virtual devices in one trace: each op's calls and time count once per device."""
    [one] = plan(["gpt2"], backends=["xla"], modes=["train"], batch_size=4, seq_len=32, warmup=1, steps=2)
    four = replace(one, devices=4, parallel="dp", scaling="strong", timeout_s=300, profile_steps=2)
    available = {"available": True, "parallel_devices": 4}
    result = Executor(str(tmp_path), pythons={"xla": xla_python}).run(four, available, lambda event: None)
    assert result["status"] == "ok" and result.get("ops_error") is None, result.get("stderr_tail")
    ops, step_us = result["ops"], result["median_step_ms"] * 1e3
    reductions = [row for row in ops if row["op"].startswith("all-reduce")]
    assert reductions and all(row["category"] == "collective" and row["calls"] == 2 for row in reductions)
    assert {row["devices"] for row in ops} == {4}
    # on PJRT CPU the devices are threads on 2 cores: one device's ops fit in one step
    assert sum(row["self_us_per_step"] for row in ops) < step_us
    collective_us = sum(row["self_us_per_step"] for row in ops if row["category"] == "collective")
    assert result["collective_ms"] * 1e3 == pytest.approx(collective_us, rel=0.05)
    assert 0 < result["collective_share"] < 1
