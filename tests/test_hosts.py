"""Runs over several hosts, for real: two ``tpubench run`` processes on 127.0.0.1, as the
user's own launcher (SSH, Slurm, a Kubernetes Indexed Job) starts one per host, meeting at
host 0's rendezvous store (tpubench.launch.hosts) with gloo ranks on loopback.

The two "hosts" share this machine, so each gets its own device-lock folder, as two machines
would have (one lock folder would make host 1 wait for host 0's CPU lock while host 0 waits
for host 1 to join). Every process a test starts carries a mark in its environment and
every temporary file goes under the test's folder: afterwards neither may remain. The
losses come from tests/host_workloads.py's ``gpt2-losses`` (a run's timed loop reads none).

CI runs one two-host case; the rest (wider worlds, faults, the join timeout) run nightly.
The Ray route is in tests/test_ray.py; TorchTPU's launch environment in
tests/test_torchtpu_env.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import ROOT, command, in_process, wait_for
from host_workloads import job_losses, one_device_losses

from tpubench import store
from tpubench.analysis.steps import job_steps
from tpubench.launch.ranks import free_port
from tpubench.parallel import hosts

TESTS_DIR = Path(__file__).resolve().parent
#: gpt2 tiny, a few AdamW steps: short, and enough to see the losses move
TRAIN = (
    "run --workload {workload} --size tiny --backend cpu --mode train --batch-size 2 --seq-len 32 --warmup 1 --steps 2"
)


class Hosts:
    """Two (or more) hosts' ``tpubench run`` on this machine, marked; see the module's doc."""

    def __init__(self, tmp: Path):
        self.tmp, self.mark = tmp, uuid.uuid4().hex
        self.scratch, self.losses = tmp / "tmp", tmp / "losses"
        self.scratch.mkdir()
        self.losses.mkdir()

    def env(self, host: int) -> dict[str, str]:
        locks = self.tmp / f"locks{host}"
        locks.mkdir(exist_ok=True)
        return {
            **os.environ,
            "TPUBENCH_WORKLOAD_MODULES": "host_workloads",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TPUBENCH_TEST_MARK": self.mark,
            "TPUBENCH_TEST_LOSSES": str(self.losses),
            "TPUBENCH_LOCK_DIR": str(locks),
            "TMPDIR": str(self.scratch),
            "GLOO_SOCKET_IFNAME": "lo",
            "COLUMNS": "200",
        }

    def start(self, host: int, line: str) -> subprocess.Popen:
        results = self.tmp / f"results{host}"
        return subprocess.Popen(
            command(f"{line} --node-rank {host} --results {results}"),
            env=self.env(host),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, line: str, count: int = 2, timeout: float = 400) -> list[tuple[int, str]]:
        """``line`` on hosts 0 to count - 1 at once; each one's exit code and output."""
        started = [self.start(host, line) for host in range(count)]
        try:
            outputs = [process.communicate(timeout=timeout)[0] for process in started]
        finally:
            for process in started:
                process.kill()
                process.wait()
        return [(process.returncode, output) for process, output in zip(started, outputs, strict=True)]

    def rows(self, host: int = 0) -> list[dict]:
        results = self.tmp / f"results{host}"
        if not (results / "runs").is_dir():
            return []
        return store.load_runs(results).to_dict("records")

    def job_losses(self) -> list[float]:
        return job_losses(self.losses)

    def left(self) -> list[int]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("TPUBENCH_TEST_MARK") == self.mark:
                    found.append(process.pid)
            except psutil.Error:
                continue
        return found


@pytest.fixture
def two_hosts(tmp_path: Path):
    group = Hosts(tmp_path)
    yield group
    wait_for(lambda: not group.left(), "every host's processes to be gone", timeout=30)
    assert not any(group.scratch.iterdir()), list(group.scratch.rglob("*"))


def check_row(row: dict, devices: int, parallel: str) -> None:
    assert row["status"] == "ok", (row.get("error"), row.get("stderr_tail"))
    assert (row["hosts"], row["devices"], row["parallel"]) == (2, devices, parallel)
    assert row["host_skew_pct"] >= 0 and row["rank_skew_pct"] >= 0
    assert len(json.loads(row["backend_metrics"])["host_median_step_ms"]) == 2
    assert row["failed_host"] is None or row["failed_host"] != row["failed_host"]  # null


def test_two_hosts_on_loopback_train_as_one_device_and_host_0_writes_the_row(two_hosts: Hosts) -> None:
    """The user-launcher route: the same command on two hosts, --node-rank 0 and 1, --master
    on host 0: one fsdp job of two ranks (one per host) whose losses are one device's. The
    steps table stores them (each rank's own, the job's their mean), and --verify, lifted
    for hosts, checks them against one cpu float32 device."""
    line = TRAIN.format(workload="gpt2-losses")
    line += f" --hosts 2 --devices 2 --parallel fsdp --master 127.0.0.1:{free_port()} --timeout 240 --verify"
    (code0, out0), (code1, out1) = two_hosts.run(line)
    assert code0 == 0, out0[-3000:]
    assert code1 == 0, out1[-3000:]
    assert "host 1 of 2: host 0 writes the rows" in out1
    assert "it recorded ok; --verify's verdict follows in host 0's rows" in out1
    (row,) = two_hosts.rows(0)
    assert two_hosts.rows(1) == []  # host 0 writes the row
    check_row(row, 2, "fsdp")
    steps = store.load_steps(two_hosts.tmp / "results0")
    assert set(steps["rank"]) == {0, 1}
    (two_hosts.losses / "solo.jsonl").unlink()  # --verify's one-device reference worker, on host 0
    found = two_hosts.job_losses()
    assert len(found) >= 3
    assert found == pytest.approx(one_device_losses(len(found), global_batch=4), rel=1e-5)
    stored = job_steps(steps).sort_values("step")["loss"]
    assert list(stored) == pytest.approx(found, rel=1e-6)  # what each rank's loss function returned
    assert row["verified"] == "match" and 0 <= row["max_rel_err"] <= 1e-5, row


@pytest.mark.nightly
@pytest.mark.parametrize("parallel", ["dp", "fsdp"])
def test_two_hosts_of_two_ranks_give_one_host_of_fours_losses(two_hosts: Hosts, parallel: str) -> None:
    """--hosts 2 --devices 4 (two gloo ranks per host) against --devices 4 on one host: the
    same losses, and both one device's."""
    line = TRAIN.format(workload="gpt2-losses")
    spread = f"{line} --devices 4 --parallel {parallel} --timeout 400 --profile --profile-steps 1"
    (code0, out0), (code1, out1) = two_hosts.run(f"{spread} --hosts 2 --master 127.0.0.1:{free_port()}")
    assert code0 == code1 == 0, out0[-3000:] + out1[-3000:]
    (row,) = two_hosts.rows(0)
    check_row(row, 4, parallel)
    # every rank's trace under the run's folder (host 0's run id), by host, on each host's disk
    for host, ranks in ((0, (0, 1)), (1, (2, 3))):
        traces = two_hosts.tmp / f"results{host}" / "traces" / row["run_id"] / f"host{host}"
        assert sorted(p.name for p in traces.iterdir()) == [f"rank{rank}" for rank in ranks]
    assert row["trace_path"].endswith(f"{row['run_id']}/host0/rank0/trace.json") and row["collective_share"] > 0
    two_hosts_losses = two_hosts.job_losses()
    for path in two_hosts.losses.glob("*.jsonl"):
        path.unlink()
    single = subprocess.run(
        command(f"{spread} --results {two_hosts.tmp / 'single'}"), env=two_hosts.env(0), cwd=ROOT,
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    one_host = two_hosts.job_losses()
    assert two_hosts_losses == pytest.approx(one_host, rel=1e-5)
    assert one_host == pytest.approx(one_device_losses(len(one_host), global_batch=8), rel=1e-5)


@pytest.mark.nightly
def test_a_host_whose_rank_is_killed_fails_the_run_and_the_row_names_it(two_hosts: Hosts) -> None:
    """Host 1's first rank is SIGKILLed in its second step: host 0's ranks are stopped at
    once (not after the collective timeout), the row says host 1, rank 2, and nothing is left."""
    line = TRAIN.format(workload="fault-host1-killed")
    line += f" --hosts 2 --devices 4 --parallel fsdp --master 127.0.0.1:{free_port()} --timeout 400"
    (code0, out0), (code1, out1) = two_hosts.run(line)
    assert code0 == code1 == 0, out0[-3000:] + out1[-3000:]  # host 0 answered: both end as it does
    (row,) = two_hosts.rows(0)
    assert (row["status"], row["failed_host"], row["failed_rank"]) == ("crashed", 1, 2), row["error"]
    assert row["error"] == "host 1: rank 2 killed by SIGKILL"
    assert row["worker_wall_s"] < 150  # the collective timeout is 200 s
    assert "it recorded crashed (host 1: rank 2 killed by SIGKILL)" in out1


@pytest.mark.nightly
def test_a_host_that_never_joins_fails_the_run_after_the_join_timeout(two_hosts: Hosts) -> None:
    line = TRAIN.format(workload="gpt2")
    line += f" --hosts 2 --devices 2 --parallel dp --master 127.0.0.1:{free_port()} --join-timeout 5"
    (code, output), = two_hosts.run(line, count=1)  # fmt: skip
    assert code == 0, output[-3000:]
    (row,) = two_hosts.rows(0)
    assert (row["status"], row["failed_host"], row["hosts"]) == ("failed", 1, 2)
    assert row["error"] == "host 1 did not join within 5 s"
    assert row["worker_wall_s"] < 30


@pytest.mark.nightly
def test_an_unreachable_host_0_is_one_clear_line_after_the_join_timeout(two_hosts: Hosts) -> None:
    port = free_port()
    line = TRAIN.format(workload="gpt2") + f" --hosts 2 --devices 2 --parallel dp --master 127.0.0.1:{port}"
    process = two_hosts.start(1, f"{line} --join-timeout 3")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output[-3000:]
    assert f"host 0 at 127.0.0.1:{port} did not answer within 3 s" in output
    assert two_hosts.rows(1) == []


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ("--hosts 3 --devices 4 --parallel fsdp", "--hosts 3 does not divide --devices 4"),
        ("--hosts 2 --parallel fsdp", "--hosts 2 needs --devices, the total over all hosts"),
        (
            "--hosts 2 --devices 4 --parallel fsdp --node-rank 2 --master 127.0.0.1:29500",
            "--node-rank 2 is not a host of --hosts 2: valid host indexes are 0 to 1",
        ),
        ("--hosts 2 --devices 4 --parallel fsdp --master 127.0.0.1:29500", "which host is this? give --node-rank"),
        ("--hosts 2 --devices 4 --parallel fsdp --node-rank 1", "where is host 0? give --master HOST:PORT"),
        ("--hosts 2 --devices 4 --parallel fsdp --node-rank 1 --master here", "--master expects HOST:PORT"),
        ("--devices 4 --parallel fsdp --node-rank 1", "--node-rank applies to a run over several hosts"),
        ("--hosts 2 --devices 4 --parallel fsdp --on ray --node-rank 0", "with --on ray, Ray places the hosts"),
        ("--hosts 2 --devices 4 --parallel fsdp --node-rank 0 --master h:1 --resume", "--resume is not supported"),
        (
            "--hosts 2 --devices 4 --parallel fsdp --node-rank 0 --master h:1 --verify --mode infer",
            "--verify checks a multi-device run of cpu by its training losses",
        ),
    ],
)
def test_bad_host_options_are_one_error_line_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: str, error: str
) -> None:
    for name in ("MASTER_ADDR", "TPU_WORKER_HOSTNAMES", *hosts.NODE_RANK_SOURCES, *hosts.SLURM_NODELISTS):
        monkeypatch.delenv(name, raising=False)
    done = in_process(f"run --workload gpt2 --backend cpu {options}", "--results", str(tmp_path / "r"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and error in lines[0], lines
    assert not (tmp_path / "r" / "runs").exists()


@pytest.mark.parametrize(
    ("environ", "node_rank", "master"),
    [
        ({"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "job-0.svc", "MASTER_PORT": "1234"}, 1, "job-0.svc:1234"),
        ({"SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08,11],cpu1"}, 1, "gpu07:29500"),
        ({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "t1k-w0,t1k-w1"}, 1, "t1k-w0:29500"),
        # the order of the sources: Kubernetes' index before TPU_WORKER_ID, the TPU names before MASTER_ADDR
        ({"JOB_COMPLETION_INDEX": "0", "TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "a,b", "MASTER_ADDR": "m"},
         0, "a:29500"),
        ({"SLURM_NODEID": "0", "MASTER_ADDR": "::1"}, 0, "[::1]:29500"),
    ],
)  # fmt: skip
def test_each_launchers_variables_say_which_host_and_where_host_0_is(
    environ: dict[str, str], node_rank: int, master: str
) -> None:
    place = hosts.place(2, None, None, environ)
    assert (place.node_rank, place.master) == (node_rank, master)
    assert hosts.place(2, 0, "h0:77", environ).master == "h0:77"  # the options win


def test_the_launchers_variables_are_checked_like_the_options() -> None:
    with pytest.raises(hosts.HostsError, match="SLURM_NODEID 2 is not a host of --hosts 2"):
        hosts.place(2, None, None, {"SLURM_NODEID": "2", "MASTER_ADDR": "m"})
    with pytest.raises(hosts.HostsError, match="is not a host index"):
        hosts.place(2, None, None, {"TPU_WORKER_ID": "w1", "MASTER_ADDR": "m"})
    with pytest.raises(hosts.HostsError, match="MASTER_PORT='x' is not a port number"):
        hosts.place(2, None, None, {"TPU_WORKER_ID": "1", "MASTER_ADDR": "m", "MASTER_PORT": "x"})


def test_the_join_key_leaves_out_what_differs_from_host_to_host() -> None:
    from tpubench.launch.hosts import identity
    from tpubench.spec import RunSpec

    base = RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 4, devices=4, parallel="dp", hosts=2)
    other = RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 4, devices=4, parallel="dp", hosts=2,
                    node_rank=1, master="h:1", join_timeout_s=9.0)  # fmt: skip
    assert identity(base) == identity(other)
    assert identity(base) != identity(RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 8, devices=4,
                                              parallel="dp", hosts=2))  # fmt: skip


def test_hosts_that_run_different_benchmarks_fail_at_the_join() -> None:
    """The rendezvous itself (a real TCPStore on loopback, a thread per host): host 1 asks for
    another batch than host 0; both learn why, and the row will name host 1."""
    import threading

    from tpubench.launch.hosts import HostFailure, HostGroup
    from tpubench.spec import RunSpec

    master = f"127.0.0.1:{free_port()}"
    specs = [
        RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", batch, devices=2, parallel="dp", hosts=2,
                node_rank=rank, master=master, join_timeout_s=30.0)
        for rank, batch in ((0, 4), (1, 8))
    ]  # fmt: skip
    failures: dict[int, dict] = {}

    def join(spec: RunSpec) -> None:
        group = HostGroup(spec)
        try:
            group.join()
        except HostFailure as failure:
            failures[spec.node_rank] = failure.result(spec)
        finally:
            group.close()

    threads = [threading.Thread(target=join, args=(spec,)) for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    reason = "host 1 runs another benchmark than host 0 (it differs in batch_size)"
    assert failures[0] == {"status": "failed", "error": reason, "failed_host": 1}
    assert failures[1]["error"] == reason and failures[1]["host0_answered"] is True
