"""Runs over several hosts, for real: two ``tpubench run`` processes on 127.0.0.1, as the
user's own launcher (SSH, Slurm, a Kubernetes Indexed Job) starts one per host, meeting at
host 0's rendezvous store (tpubench.launch.hosts) with gloo ranks on loopback.

The two "hosts" share this machine, and each gets its own device-lock folder, as two machines
would have, except where a test gives them one (hosts of one run share its lock: once, host 1
waited for host 0's CPU lock while host 0 waited for host 1 to join). Every process a test
starts carries a mark in its environment and every temporary file goes under the test's
folder: afterwards neither may remain. The losses come from tests/host_workloads.py's
``gpt2-losses`` (a run's timed loop reads none).

CI runs two two-host cases (one with one lock folder); the rest (wider worlds, faults, the join
timeout, a host index given twice) run nightly, the rendezvous's own faults also in CI.
The Ray route is in tests/test_ray.py; TorchTPU's launch environment in
tests/test_torchtpu_env.py.
"""

from __future__ import annotations

import json
import os
import re
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

    def __init__(self, tmp: Path, one_lock_folder: bool = False):
        self.tmp, self.mark, self.one_lock_folder = tmp, uuid.uuid4().hex, one_lock_folder
        self.scratch, self.losses, self.gate = tmp / "tmp", tmp / "losses", tmp / "gate"
        for folder in (self.scratch, self.losses, self.gate):
            folder.mkdir()

    def env(self, host: int, locks: str | None = None) -> dict[str, str]:
        """Host ``host``'s environment; its device locks in ``locks`` (a folder's name), by
        default its own folder, or the one all hosts share (``one_lock_folder``)."""
        locks_dir = self.tmp / (locks or ("locks" if self.one_lock_folder else f"locks{host}"))
        locks_dir.mkdir(exist_ok=True)
        return {
            **os.environ,
            "TPUBENCH_WORKLOAD_MODULES": "host_workloads",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TPUBENCH_TEST_MARK": self.mark,
            "TPUBENCH_TEST_LOSSES": str(self.losses),
            "TPUBENCH_LOCK_DIR": str(locks_dir),
            "TPUBENCH_TEST_GATE": str(self.gate),
            "TMPDIR": str(self.scratch),
            "GLOO_SOCKET_IFNAME": "lo",
            "COLUMNS": "200",
        }

    def start(self, host: int, line: str, locks: str | None = None) -> subprocess.Popen:
        results = self.tmp / f"results{host}"
        return subprocess.Popen(
            command(f"{line} --node-rank {host} --results {results}"),
            env=self.env(host, locks),
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


def _left_nothing(group: Hosts):
    yield group
    wait_for(lambda: not group.left(), "every host's processes to be gone", timeout=30)
    assert not any(group.scratch.iterdir()), list(group.scratch.rglob("*"))


@pytest.fixture
def two_hosts(tmp_path: Path):
    yield from _left_nothing(Hosts(tmp_path))


@pytest.fixture
def two_hosts_one_lock_folder(tmp_path: Path):
    yield from _left_nothing(Hosts(tmp_path, one_lock_folder=True))


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


def test_two_hosts_on_one_machine_share_one_lock_folder(two_hosts_one_lock_folder: Hosts) -> None:
    """Two hosts of one run on one machine with one TPUBENCH_LOCK_DIR (the default): host 1
    held the CPU's lock while it waited for host 0 to start the run, and host 0 waited for the
    lock, until the join timeout failed the run (by default half of --timeout; a user saw it
    as a hang). Now the host that finds the lock held by a host of its own run shares it, and
    says so in one line; the run is ok."""
    group = two_hosts_one_lock_folder
    line = (
        "run --workload gpt2 --size tiny --backend cpu --mode infer --batch-size 2 --seq-len 32 --warmup 1 --steps 1"
        f" --hosts 2 --devices 2 --parallel dp --master 127.0.0.1:{free_port()} --timeout 240 --join-timeout 60"
    )
    (code0, out0), (code1, out1) = group.run(line, timeout=300)  # the old deadlock: 2 join timeouts, then a failure
    assert code0 == code1 == 0, out0[-3000:] + out1[-3000:]
    (row,) = group.rows(0)
    assert row["status"] == "ok", (row["error"], out0[-3000:], out1[-3000:])
    said = [text for text in (out0 + out1).splitlines() if "sharing the cpu with host" in text]
    assert len(said) == 1 and "of this run (pid" in said[0], out0 + out1


def test_the_lock_names_a_run_alike_on_every_host_and_apart_from_other_runs() -> None:
    """Hosts of one run share a device's lock by its name of the run (runner.lock_job): equal on
    host 0 and host 1, another for another benchmark or another rendezvous, none on one host."""
    from tpubench.runner import lock_job
    from tpubench.spec import RunSpec

    def spec(batch: int = 4, **fields) -> RunSpec:
        layout = {"devices": 2, "parallel": "dp", "hosts": 2, "master": "127.0.0.1:29500", **fields}
        return RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", batch, **layout)

    host0, host1 = lock_job(spec(node_rank=0)), lock_job(spec(node_rank=1, join_timeout_s=9.0))
    assert host0 is not None and host1 is not None and (host0.host, host1.host) == (0, 1)
    assert host0.key == host1.key
    assert lock_job(spec(batch=8)).key != host0.key and lock_job(spec(master="h:1")).key != host0.key
    assert lock_job(RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 4)) is None


def test_a_second_process_of_one_host_index_leaves_and_ends_the_run() -> None:
    """The rendezvous itself (a real TCPStore on loopback, a thread per host): host 0 and host 1
    have started the run when a second process joins as host 1. It leaves at once, saying
    why; the run's end is signalled to the others (their ranks would be stopped), and host 0
    names the index given twice. Before, it joined as host 1 again."""
    import select
    import threading

    from tpubench.launch.hosts import HostFailure, HostGroup
    from tpubench.spec import RunSpec

    master = f"127.0.0.1:{free_port()}"

    def group(rank: int) -> HostGroup:
        return HostGroup(RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 4, devices=2, parallel="dp",
                                 hosts=2, node_rank=rank, master=master, join_timeout_s=30.0))  # fmt: skip

    started = [group(0), group(1)]
    joins = [threading.Thread(target=each.join) for each in started]
    for thread in joins:
        thread.start()
    for thread in joins:
        thread.join(timeout=60)
    second = group(1)
    try:
        with pytest.raises(HostFailure) as failure:
            second.join()
        reason = "two processes joined as host 1: each host needs its own index, 0 to 1 (--node-rank, or the "
        reason += "launcher's variable)"
        assert failure.value.result(second.spec)["error"] == reason and failure.value.row["failed_host"] == 1
        for each in started:  # the event: each host's watcher of the run's end wakes
            assert each.end_fd is not None and select.select([each.end_fd], [], [], 30)[0], each.rank
        assert started[0].joined_twice() == [1] and started[1].ended_by()["error"] == reason
    finally:
        for each in (second, started[1], started[0]):
            each.close()


@pytest.mark.nightly
def test_two_processes_given_one_host_index_stop_the_run_and_host_0_names_it(two_hosts: Hosts) -> None:
    """A second process given --node-rank 1 while the run is under way (its ranks met, each
    at its first step): its rank 1 joined the first's process group, and gloo said
    "Connection reset by peer" on one host while the other said host 0 gave "no status
    within 315 s" after under 50. Now the second process leaves at once, naming the index
    it was given twice; the run stops, and host 0's row names host 1 and why."""
    line = TRAIN.format(workload="gpt2-gated")
    line += f" --hosts 2 --devices 2 --parallel dp --master 127.0.0.1:{free_port()} --timeout 200"
    first = [two_hosts.start(0, line), two_hosts.start(1, line)]
    started = list(first)
    try:
        under_way = [two_hosts.gate / f"reached-{rank}" for rank in (0, 1)]
        gone = lambda: any(process.poll() is not None for process in first)  # noqa: E731
        wait_for(
            lambda: all(path.exists() for path in under_way) or gone(), "both hosts' ranks at their first step", 240
        )
        assert not gone(), [process.communicate()[0][-3000:] for process in first]
        started.append(two_hosts.start(1, line, locks="locks-second"))  # the same index, another lock folder
        code2, out2 = started[2].wait(timeout=120), started[2].communicate()[0]
        (code0, out0), (code1, out1) = [(p.wait(timeout=120), p.communicate()[0]) for p in first]
    finally:
        for process in started:
            process.kill()
            process.wait()
    reason = "two processes joined as host 1: each host needs its own index, 0 to 1 (--node-rank, or the launcher's "
    reason += "variable)"
    assert code2 == 1 and reason in out2, out2[-3000:]
    assert code0 == code1 == 0, out0[-3000:] + out1[-3000:]  # host 0 answered: they end as it does
    (row,) = two_hosts.rows(0)
    assert (row["status"], row["error"], row["failed_host"]) == ("failed", reason, 1), row["error"]
    assert f"it recorded failed ({reason})" in out1


def test_a_host_says_how_long_it_waited_for_a_host_0_that_went_away() -> None:
    """Host 0's store gone while host 1 waits up to 300 s for the run's status: host 1 said
    "host 0 gave no status for the run within 300 s" at once; it now says it stopped
    answering, after how long. The rendezvous itself: a real TCPStore, a thread per host."""
    import threading
    import time

    from tpubench.launch.hosts import HostGroup
    from tpubench.spec import RunSpec

    master = f"127.0.0.1:{free_port()}"
    groups = [
        HostGroup(RunSpec("s", "gpt2", "tiny", "cpu", "train", "float32", 4, devices=2, parallel="dp", hosts=2,
                          node_rank=rank, master=master, join_timeout_s=30.0))
        for rank in (0, 1)
    ]  # fmt: skip
    joins = [threading.Thread(target=group.join) for group in groups]
    for thread in joins:
        thread.start()
    for thread in joins:
        thread.join(timeout=60)
    assert groups[1].run_id == groups[0].run_id != ""  # both joined
    said: dict[str, object] = {}
    began = time.monotonic()
    follow = threading.Thread(target=lambda: said.update(groups[1].follow_host0(300.0)))
    follow.start()
    groups[0].close()  # host 0's store goes, with no status for the run
    follow.join(timeout=60)
    waited = time.monotonic() - began
    groups[1].close()
    assert waited < 60 and said["status"] == "failed" and said["host0_answered"] is False, said
    assert re.fullmatch(r"host 0 stopped answering after \d+ s and gave no status for the run", str(said["error"]))


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
