"""Multi-device runs of the process families with real gloo ranks on 127.0.0.1.

The losses check the split itself (tpubench.parallel.dtensor, driven by
tests/parallel_losses.py in real rank processes: a run's timed loop reads no loss); the
runs check the launcher (tpubench.launch.ranks) through a real worker: the merged row,
every rank's steps, and each fault. Every gloo world costs 10-20 s here, mostly imports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict
from pathlib import Path
from statistics import median

import pandas as pd
import psutil
import pytest
from helpers import wait_for
from parallel_losses import run as one_device

from tpubench.analysis.steps import job_steps
from tpubench.backends.base import DEFAULT_WORKER_ENV
from tpubench.hostload import HostLoad, busy_warning
from tpubench.launch import ranks
from tpubench.launch.process import classify, run_worker, worker_env
from tpubench.measure import make_step
from tpubench.spec import RunSpec
from workloads import load

TESTS_DIR = Path(__file__).resolve().parent
#: what CI runs: every plan at the smallest world that has it, on both decoders
CI_WORLDS = {
    2: ("gpt2:dp", "gpt2:fsdp", "gpt2:tp", "llama3:dp", "llama3:fsdp", "llama3:tp"),
    4: ("gpt2:fsdp_tp:2", "llama3:fsdp_tp:2"),
}
#: the nightly matrix adds other workloads' FSDP units and wider worlds (llama3 tiny's 2 KV
#: heads cap its TP degree at 2). Only workloads whose loss is a mean over equal shares of
#: the batch match one device exactly: resnet's batch norm, bert's masked tokens and
#: mixtral's expert capacity depend on what the rank's slice holds, as under any DDP
NIGHTLY_WORLDS = {
    2: ("vit:dp", "vit:fsdp", "dit:fsdp"),
    4: ("gpt2:dp", "gpt2:fsdp", "gpt2:tp", "llama3:dp", "llama3:fsdp", "gpt2:fsdp_tp:4"),
    8: ("gpt2:fsdp_tp:2", "gpt2:fsdp_tp:4", "llama3:fsdp_tp:2"),
}


def split_runs(world: int, configurations: tuple[str, ...]) -> dict[str, dict]:
    """tests/parallel_losses.py in ``world`` real rank processes; rank 0's JSON."""
    port = ranks.free_port()
    env = {**os.environ, **DEFAULT_WORKER_ENV, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, str(TESTS_DIR / "parallel_losses.py"), *configurations],
            env={**env, **ranks.rank_env(rank, world, port)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    failed = {
        rank: f"exit {p.returncode}; stdout {stdout[-300:]!r}; stderr {stderr[-3000:]}"
        for rank, (p, (stdout, stderr)) in enumerate(zip(processes, outputs, strict=True))
        if p.returncode
    }
    assert not failed, failed
    return json.loads(outputs[0][0])


def check_losses(world: int, configurations: tuple[str, ...]) -> dict[str, dict]:
    """Every split configuration's losses are the one-device run's (float32, to rounding)."""
    found = split_runs(world, configurations)
    references = {name: one_device(f"{name}:none") for name in {c.split(":")[0] for c in configurations}}
    for configuration, result in found.items():
        reference = references[configuration.split(":")[0]]
        assert result["losses"] == pytest.approx(reference["losses"], rel=1e-5), configuration
        assert result["losses"][0] > result["losses"][-1], configuration  # it trained
        if configuration.split(":")[1] == "tp":  # the whole batch on every rank: the same greedy tokens
            assert result["tokens"] == reference["tokens"], configuration
    return found


def test_every_plan_at_world_2_gives_the_one_device_losses_and_fsdp_holds_half() -> None:
    found = check_losses(2, CI_WORLDS[2])
    for name in ("gpt2", "llama3"):
        total = one_device(f"{name}:none")["local_params"]
        assert found[f"{name}:dp"]["local_params"] == total  # DDP replicates
        assert found[f"{name}:fsdp"]["local_params"] == total // 2  # every tensor's dim 0 split in two
        assert total // 2 < found[f"{name}:tp"]["local_params"] < total  # the embeddings and norms stay whole


def test_fsdp_tp_at_world_4_gives_the_one_device_losses() -> None:
    check_losses(4, CI_WORLDS[4])


@pytest.mark.nightly
@pytest.mark.parametrize("world", sorted(NIGHTLY_WORLDS))
def test_wider_worlds_give_the_one_device_losses(world: int) -> None:
    check_losses(world, NIGHTLY_WORLDS[world])


def spec_for(workload: str, parallel: str = "dp", devices: int = 2, **fields) -> RunSpec:
    defaults = {"mode": "train", "batch_size": 4, "seq_len": 16, "warmup": 1, "steps": 3, "timeout_s": 120.0}
    return RunSpec(
        suite="test",
        workload=workload,
        size="tiny",
        backend="cpu",
        dtype="float32",
        devices=devices,
        parallel=parallel,
        tp_size=devices if parallel == "tp" else 1,
        scaling="strong",
        **(defaults | fields),
    )


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Run a spec in a real worker whose processes carry a mark in their environment, with
    temporary files under a folder of the test's; afterwards no marked process and no
    temporary file may remain."""
    mark, scratch = uuid.uuid4().hex, tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def run(spec: RunSpec) -> dict:
        env = worker_env({**DEFAULT_WORKER_ENV, "TPUBENCH_TEST_MARK": mark})
        outcome = run_worker({"kind": "run", "spec": spec.to_json()}, python=sys.executable, env=env,
                             timeout_s=spec.timeout_s, fork=False)  # fmt: skip
        return classify(outcome, spec.timeout_s)

    yield run

    def left() -> list[int]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("TPUBENCH_TEST_MARK") == mark:
                    found.append(process.pid)
            except psutil.Error:
                continue
        return found

    wait_for(lambda: not left(), "every rank and worker to be gone", timeout=30)
    assert not any(scratch.iterdir()), list(scratch.rglob("*"))


def one_device_train_losses(steps: int, batch: int, seq_len: int) -> list[float]:
    """gpt2 tiny's loss at each of ``steps`` of the worker's own train step, on one device, in
    this process: with the system's temporary folder, as the caches torch makes in it on its
    first optimizer step are not the run's debris that ``marked`` looks for."""
    saved, tempfile.tempdir = tempfile.tempdir, None
    try:
        instance = load("gpt2", "tiny", batch_size=batch, seq_len=seq_len)
        step = make_step(instance, instance.model, "train")
        return [step().item() for _ in range(steps)]
    finally:
        tempfile.tempdir = saved


def test_a_fsdp_run_merges_its_ranks_and_profiles_each(marked, tmp_path: Path) -> None:
    """The job's row: per step the slowest rank, every rank's samples, the spread and the
    memory of the ranks; each rank traces its own steps, and rank 0's ops are the row's."""
    # the worker reads the trace's collectives with tpubench.traces.collectives (the multi-device read side)
    profiling = importlib.util.find_spec("tpubench.traces.collectives") is not None
    traced = {"profile_steps": 1, "trace_dir": str(tmp_path / "trace")} if profiling else {}
    row = marked(spec_for("gpt2", "fsdp", **traced))
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    steps = row["steps"]
    assert {step["rank"] for step in steps} == {0, 1}
    by_rank = [[s for s in steps if s["rank"] == rank and s["phase"] == "measure"] for rank in (0, 1)]
    assert [len(rows) for rows in by_rank] == [3, 3]
    slowest = [max(a["step_ms"], b["step_ms"]) for a, b in zip(*by_rank, strict=True)]
    assert row["median_step_ms"] == pytest.approx(median(slowest))
    job = job_steps(pd.DataFrame(steps).assign(run_id="run"))  # what the readers sample
    assert sorted(job.loc[job["phase"] == "measure", "step_ms"]) == pytest.approx(sorted(slowest))
    # each rank stored its own slice's loss at every step; their mean, the job's, is one device's
    # (docs/multi-device.md: to 1e-5), read after the timed steps
    assert all(step["loss"] is not None for step in steps)
    job_losses = list(job.sort_values("step")["loss"])
    assert job_losses == pytest.approx(one_device_train_losses(len(job_losses), batch=4, seq_len=16), rel=1e-5)
    assert row["tokens_per_s"] == pytest.approx(4 * 16 / (row["median_step_ms"] / 1e3))  # the global batch
    medians = json.loads(row["backend_metrics"])["rank_median_step_ms"]
    assert medians == pytest.approx([median(s["step_ms"] for s in rows) for rows in by_rank])
    assert row["rank_skew_pct"] == pytest.approx((max(medians) - min(medians)) / median(medians) * 100)
    assert row["peak_mem_bytes"] >= row["peak_mem_bytes_min"] > 0
    assert row["param_count"] == 790_016  # the model's, not a rank's shard
    assert "failed_rank" not in row
    if not profiling:
        pytest.skip("the ranks' rows checked; their traces need tpubench.traces.collectives")
    traces = sorted(p.relative_to(tmp_path / "trace").as_posix() for p in (tmp_path / "trace").rglob("*.json"))
    assert traces == ["rank0/trace.json", "rank1/trace.json"] and row["trace_path"].endswith("rank0/trace.json")
    categories = {op["op"]: op["category"] for op in row["ops"]}
    assert any(category == "collective" for category in categories.values()), sorted(categories)
    copies = {category for op, category in categories.items() if "all_gather_copy" in op}
    assert copies == {"data movement"}, categories  # FSDP2's local copies around its all-gathers


@pytest.mark.filterwarnings("ignore::tpubench.TpubenchWarning")  # no peak for the ranks' unnamed device
def test_a_jobs_host_busy_warning_is_one_and_says_what_its_row_stores() -> None:
    """Each rank measures the host over its own window and warned with its own share (78%,
    76%) while the row kept rank 0's: the job's row has one warning, of the share it stores,
    the most contended rank's (every rank waits for the slowest at each collective)."""
    from tpubench.measure import StepRecord

    def rank(share: float, *notes: str) -> dict:
        phases = ["first", "warmup", "measure", "measure", "measure"]
        steps = [asdict(StepRecord(index, phase, 10.0, 1.0, 0)) for index, phase in enumerate(phases)]
        busy = [busy_warning(HostLoad(2.0, share))] if share > 0.2 else []
        return {"status": "ok", "steps": steps, "warmup_steps": 1, "host_load_1m": 2.0,
                "host_other_cpu_share": share, "warnings": "\n".join([*notes, *busy]) or None}  # fmt: skip

    row = ranks.merge(spec_for("gpt2"), [rank(0.01, "a note of both ranks"), rank(0.35, "a note of both ranks")])
    assert row["host_other_cpu_share"] == 0.35
    assert row["warnings"].splitlines() == ["a note of both ranks", busy_warning(HostLoad(2.0, 0.35))]
    quiet = ranks.merge(spec_for("gpt2"), [rank(0.01), rank(0.05)])
    assert quiet["host_other_cpu_share"] == 0.05 and "host busy" not in (quiet["warnings"] or "")


@pytest.mark.parametrize(
    ("workload", "status", "error"),
    [
        ("fault-rank1-raise", "failed", "rank 1: RuntimeError: deliberate failure on rank 1"),
        ("fault-rank1-killed", "crashed", "rank 1 killed by SIGKILL"),
    ],
)
def test_a_rank_that_fails_takes_the_others_down(
    fault_workloads: None, marked, workload: str, status: str, error: str
) -> None:
    """Rank 1 faults in its second step while rank 0 waits for it in a collective: rank 0
    is killed at once (not after the collective's timeout), and the row names rank 1."""
    spec = spec_for(workload, batch_size=2, seq_len=None, timeout_s=300.0)
    row = marked(spec)
    assert (row["status"], row["error"], row["failed_rank"]) == (status, error, 1)
    assert row["worker_wall_s"] < 60  # not the collective timeout (150 s) nor the run's
    if status == "failed":
        assert "rank 1's output" in row["stderr_tail"] and "deliberate failure on rank 1" in row["stderr_tail"]


#: rank 0 of the race below: it reports the error a dead peer gives gloo, then exits
PEER_ERROR = """
import json, os, sys, time
error = "RuntimeError: Connection closed by peer [127.0.0.1]:9125"
result = {"status": "failed", "error": error}
os.write(int(sys.argv[1]), (json.dumps({"event": "result", "result": result, "at": time.monotonic()}) + "\\n").encode())
"""
#: rank 1: killed by a signal only once rank 0 has exited (rank 0 holds the pipe it reads)
KILLED_AFTER_PEER = "import os, signal, sys; sys.stdin.read(); os.kill(os.getpid(), signal.SIGKILL)"


def test_a_killed_rank_is_blamed_even_when_its_peers_error_reaches_the_launcher_first() -> None:
    """A SIGKILLed rank breaks its peers' connections as it dies, and a peer's error can be
    read before the dead rank's channel closes: the launcher still names the dead rank."""
    peer_read, peer_write = os.pipe()
    channels = [os.pipe() for _ in range(2)]
    started = []
    try:
        for index, code in enumerate((PEER_ERROR, KILLED_AFTER_PEER)):
            read_fd, write_fd = channels[index]
            process = subprocess.Popen(
                [sys.executable, "-c", code, str(write_fd)],
                stdin=peer_read if index == 1 else subprocess.DEVNULL,
                pass_fds=(write_fd, peer_write) if index == 0 else (write_fd,),
            )
            os.close(write_fd)
            started.append(ranks.Rank(index, process, read_fd, log=None))
        os.close(peer_read)
        os.close(peer_write)
        row = ranks.follow(started, channel=None)
    finally:
        for rank in started:
            rank.kill()
            rank.process.wait()
            os.close(rank.channel)
    assert row is not None
    assert (row["status"], row["error"], row["failed_rank"]) == ("crashed", "rank 1 killed by SIGKILL", 1)


def test_a_timeout_kills_every_rank(fault_workloads: None, marked) -> None:
    row = marked(spec_for("fault-hang", batch_size=2, seq_len=None, timeout_s=12.0))
    assert row["status"] == "timeout"


@pytest.mark.nightly
def test_ranks_die_with_their_launcher(fault_workloads: None) -> None:
    """The worker alone killed (not its process group): its ranks' lifelines close, and they exit."""
    spec = spec_for("fault-hang", batch_size=2, seq_len=None, timeout_s=300.0)
    read_fd, write_fd = os.pipe()
    worker = subprocess.Popen(
        [sys.executable, "-m", "tpubench.launch.serve", "--channel-fd", str(write_fd)],
        stdin=subprocess.PIPE,
        pass_fds=(write_fd,),
        env=worker_env(DEFAULT_WORKER_ENV),
        start_new_session=True,
    )
    try:
        os.close(write_fd)
        assert worker.stdin is not None
        worker.stdin.write(json.dumps({"kind": "run", "spec": spec.to_json()}).encode() + b"\n")
        worker.stdin.flush()
        launcher = psutil.Process(worker.pid)
        found = wait_for(lambda: len(launcher.children()) == 2 and launcher.children(), "the two ranks to start")
        worker.kill()
        worker.wait()
        _, alive = psutil.wait_procs(found, timeout=30)
        assert not alive
    finally:
        worker.kill()
        worker.wait()
        if worker.stdin:
            worker.stdin.close()
        os.close(read_fd)
