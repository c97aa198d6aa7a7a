"""A multi-device run of a process family: N rank processes, and their rows merged into one.

The run's worker becomes a launcher (:func:`measure_ranks`): it starts N fresh interpreters
(:mod:`tpubench.launch.rank`; fresh, not forked: CUDA cannot be forked once initialised
and TorchTPU not at all) with torchrun's variables, and each rank runs the worker's own
``measure()`` on its device. The ranks stay in the worker's process group, so the
runner's kill on a timeout takes them all, and each holds a lifeline pipe from the worker,
so they die with it. Rank 0's phase events are the run's progress; every rank's result
comes back over its own pipe.

A rank that fails or dies takes the others down at once (they would wait in a collective
until their timeout): the row is that rank's ``failed``/``oom``/``crashed``, with
``failed_rank`` and its output's tail.

The merged row is the job's: per step, the slowest rank's time (the job moves at the pace
of its slowest rank); every rank's samples in the steps table (``rank``); how far the
ranks' medians spread (``rank_skew_pct``); the largest and smallest rank's peak memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from tpubench import worker
from tpubench.backends import get_backend
from tpubench.ceilings import CeilingSpec
from tpubench.energy import NVML
from tpubench.hostload import job_columns
from tpubench.launch import hosts
from tpubench.measure import Measurement, StepRecord
from tpubench.memory import PART_COLUMNS
from tpubench.parallel import family, host_devices, torchtpu_env
from tpubench.serving.metrics import GenerationTiming
from tpubench.spec import RunSpec

#: lines of a failed rank's output the row keeps (the runner's worker-log tail is 40)
TAIL_LINES = 36
#: how long ranks that all sent their results may take to exit before they are killed
EXIT_GRACE_S = 10.0
#: how long, after a rank's failure, the others have to send their results or exit before
#: the launcher decides which rank failed first (and kills the rest)
SETTLE_S = 5.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for the rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's variables for one rank of a one-host run, and tpubench's mark
    (``TPUBENCH_RANK``: :func:`tpubench.parallel.ranks_env`). gloo talks over loopback
    only: without ``GLOO_SOCKET_IFNAME`` it resolves the host name's interface."""
    return {
        "TPUBENCH_RANK": "1",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
    }


def hosts_rank_env(spec: RunSpec, group: hosts.HostGroup, rank: int, local: int) -> dict[str, str]:
    """torchrun's variables for one rank of a run over several hosts: its global rank, its
    place on its host, and host 0's store, which the host agent there serves to every rank
    (``TORCHELASTIC_USE_AGENT_STORE``: no rank starts a store of its own, as under torchrun)."""
    host, port = group.master
    env = {
        "TPUBENCH_RANK": "1",
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(spec.devices),
        "LOCAL_WORLD_SIZE": str(host_devices(spec)),
        "GROUP_RANK": str(spec.node_rank),
        "GROUP_WORLD_SIZE": str(spec.hosts),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    if hosts.is_loopback(host):  # hosts on one machine (tests): gloo on loopback as for one host
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def family_env(spec: RunSpec, group: hosts.HostGroup | None = None) -> dict[str, str]:
    """What every rank of this family needs besides torchrun's variables: on the host's CPUs
    each rank's share of its cores (torchrun's one thread would leave cores idle, torch's
    default of all of them oversubscribes them N times); TorchTPU's launch environment
    (slice-builder addresses, topology; on several hosts also theirs), decided once for all
    of the host's ranks."""
    local = host_devices(spec)
    if family(spec.backend) == "cpu":
        return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // local))}
    if family(spec.backend) != "tpu":
        return {}
    availability = get_backend(spec.backend).availability()  # the PCI bus: no chip is opened
    chip = availability.device_name or None
    if group is None:
        return torchtpu_env.launch_env(
            os.environ, local, chip=chip, host_devices=availability.device_count, pick_port=free_port
        )
    host, port = group.master
    return torchtpu_env.hosts_launch_env(
        os.environ,
        local,
        hosts=spec.hosts,
        node_rank=spec.node_rank,
        master=(host, port),
        addresses=group.addresses,
        chip=chip,
        host_devices=availability.device_count,
        pick_port=free_port,
        session_id=lambda: group.run_id,  # one profiling session for every host's ranks
    )


@dataclass
class Rank:
    """One started rank: its process, the read end of its channel, and what it said."""

    index: int
    process: subprocess.Popen
    channel: int
    log: Path | None  # its output, when not the worker's own (rank 0 writes to the worker's log)
    local: int = 0  # its place on its host (the first writes to the worker's log, and gives the progress)
    buffer: bytes = b""
    result: dict[str, Any] | None = None
    result_at: float = 0.0  # time.monotonic() when the rank sent it (one clock for all processes)
    closed: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    def take(self, chunk: bytes) -> None:
        """Add what the channel delivered; complete lines become events."""
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event["event"] == "result":
                self.result, self.result_at = event["result"], event["at"]
            else:
                self.events.append(event)

    def tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-TAIL_LINES:])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


def start_rank(
    spec: RunSpec | CeilingSpec,
    index: int,
    port: int,
    env: dict[str, str],
    scratch: str,
    group: hosts.HostGroup | None = None,
    local: int | None = None,
    kind: str = "run",
) -> Rank:
    """Start rank ``index`` (the ``local``-th of its host, on a run over several hosts): the
    request (a run, or a collective ceilings sweep: ``kind``) on its stdin's first line,
    stdin then its lifeline."""
    local = index if local is None else local
    rank_spec = spec
    if isinstance(spec, RunSpec) and spec.trace_dir:  # each rank traces its steps, side by side in the run's folder
        trace_dir = spec.trace_dir
        if group is not None:  # the run's folder (host 0's run id), then one folder per host
            if group.run_id and os.path.basename(trace_dir) == spec.run_id:
                trace_dir = os.path.join(os.path.dirname(trace_dir), group.run_id)
            trace_dir = os.path.join(trace_dir, f"host{spec.node_rank}")
        rank_spec = replace(spec, trace_dir=os.path.join(trace_dir, f"rank{index}"))
    torchrun = rank_env(index, spec.devices, port) if group is None else hosts_rank_env(spec, group, index, local)
    read_fd, write_fd = os.pipe()
    log = None if local == 0 else Path(scratch) / f"rank{index}.log"
    output = None if log is None else open(log, "wb")  # noqa: SIM115 (closed once the child holds it)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tpubench.launch.rank", "--channel-fd", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            pass_fds=(write_fd,),
            env={**os.environ, **env, **torchrun},
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
        if output:
            output.close()
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a rank that died at once: its exit status says why
        process.stdin.write(json.dumps({"kind": kind, "spec": rank_spec.to_json()}).encode() + b"\n")
        process.stdin.flush()
    return Rank(index, process, read_fd, log, local=local)


def measure_ranks(spec: RunSpec, channel: Any) -> dict[str, Any]:
    """Run ``spec`` as N ranks and return the job's row (or the failing rank's). On several
    hosts this is one host's share: its ranks, after the hosts met (:mod:`.hosts`); host 0
    returns the job's row, the others the status host 0 gave it."""
    if spec.hosts == 1:
        outcome = run_host(spec, channel)
        if outcome["status"] != "ok":
            return failed_row(outcome)
        return merged_row(spec, outcome["ranks"], outcome["notes"])
    group = hosts.HostGroup(spec)
    try:
        try:
            group.join()
        except hosts.HostFailure as failure:
            return failure.result(spec)
        return finish_hosts(spec, group, run_host(spec, channel, group))
    finally:
        group.close()


def failed_row(outcome: dict[str, Any]) -> dict[str, Any]:
    """The row of a host's failed :func:`run_host` outcome: its failing rank's, less the output
    tail and the time it was seen, which only the hosts' exchange reads."""
    return {key: value for key, value in outcome.items() if key not in ("tail", "at")}


def run_host(
    spec: RunSpec | CeilingSpec, channel: Any, group: hosts.HostGroup | None = None, kind: str = "run"
) -> dict[str, Any]:
    """This host's ranks (of a run, or of a collective ceilings sweep: ``kind``), started and
    followed to their end: ``{"status": "ok", "ranks": [their results], "notes": [...]}``, or
    the failed row of the rank that failed first (with its output's ``tail`` and the
    wall-clock time ``at`` which it was seen)."""
    layout = spec if isinstance(spec, RunSpec) else spec.run_spec()  # a sweep's ranks are laid out as a run's
    local_ranks = host_devices(layout)
    first = layout.node_rank * local_ranks
    with tempfile.TemporaryDirectory(prefix="tpubench-ranks-") as scratch:
        env = family_env(layout, group)
        port = group.master[1] if group else free_port()
        ranks: list[Rank] = []
        try:
            for local in range(local_ranks):
                ranks.append(start_rank(spec, first + local, port, env, scratch, group, local, kind))
            failure = follow(ranks, channel, group.end_fd if group else None)
            if failure is not None:
                return {**failure, "at": time.time()}
            notes = wait_for_exit(ranks)
        finally:
            for rank in ranks:
                rank.kill()
                rank.process.wait()
                if rank.process.stdin:
                    rank.process.stdin.close()
                os.close(rank.channel)
    return {"status": "ok", "ranks": [rank.result for rank in ranks], "notes": notes}


def merged_row(spec: RunSpec, results: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    row = merge(spec, results)
    if notes:
        row["warnings"] = "\n".join(filter(None, [row.get("warnings"), *notes]))
    return row


#: what host 0 does not need of the other hosts' ranks (only rank 0's ops and compiles are the row's)
LOCAL_ONLY = ("ops", "compiles")


def finish_hosts(spec: RunSpec, group: hosts.HostGroup, outcome: dict[str, Any]) -> dict[str, Any]:
    """One host's end of a multi-host run: the others report to host 0 and take the status
    it gave the row; host 0 merges every host's ranks into the job's row, or names the host
    that failed."""
    collective_s = spec.timeout_s * 0.5  # the ranks' collective timeout (tpubench.parallel.dtensor)
    if spec.node_rank != 0:
        if outcome["status"] == "ok":
            slim = [{k: v for k, v in result.items() if k not in LOCAL_ONLY} for result in outcome["ranks"]]
            outcome = {**outcome, "ranks": slim}
        group.report(outcome)
        return group.follow_host0(hosts.SETTLE_S + collective_s)
    outcomes = group.gather(outcome, collective_s)
    if all(o is not None and o["status"] == "ok" for o in outcomes.values()):
        row = merged_hosts(spec, outcomes)  # type: ignore[arg-type]
    elif doubled := group.joined_twice():  # the run was stopped by the second process of one index
        row = {"status": "failed", "error": hosts.twice(doubled[0], spec.hosts), "failed_host": doubled[0]}
    else:
        row = hosts.culprit(outcomes)
    group.announce(row)
    return row


def measure_spmd_hosts(spec: RunSpec, channel: Any) -> dict[str, Any]:
    """torch_xla over several hosts: one process per host over its devices, the SPMD mesh
    over every host's (``hosts x devices per host``). The hosts meet as the process
    families' do (:mod:`.hosts`); torch_xla's runtime then finds the others from
    ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` (set from the rendezvous where the TPU VM
    does not already), and each host measures its share; host 0 merges them as ranks."""
    if reason := spmd_hosts_refusal():
        return {"status": "unavailable", "error": reason}
    group = hosts.HostGroup(spec)
    try:
        try:
            group.join()
        except hosts.HostFailure as failure:
            return failure.result(spec)
        os.environ.update(spmd_hosts_env(spec, group, os.environ))
        try:
            result = worker.measure(spec, channel)
        except Exception as error:
            traceback.print_exc()
            status = "oom" if worker.is_oom(error) else "failed"
            result = {"status": status, "error": f"{type(error).__name__}: {error}"}
        if result["status"] == "ok":
            outcome = {"status": "ok", "ranks": [result], "notes": []}
        else:
            outcome = {**result, "failed_rank": spec.node_rank, "at": time.time()}
        return finish_hosts(spec, group, outcome)
    finally:
        group.close()


def spmd_hosts_refusal() -> str | None:
    """Why torch_xla cannot span hosts here (None: it can): PJRT's CPU client has no
    distributed runtime, so only TPU hosts form a multi-host mesh."""
    from tpubench.backends.xla import _pjrt_device

    if (device := _pjrt_device()) != "TPU":
        return f"torch_xla over several hosts needs TPU hosts (PJRT_DEVICE=TPU): PJRT {device} has no such runtime"
    return None


def spmd_hosts_env(spec: RunSpec, group: hosts.HostGroup, environ: Any) -> dict[str, str]:
    """What torch_xla's TPU runtime reads to find the slice's other hosts, where the TPU VM's
    metadata does not already say: this host's worker id and every host's address."""
    env = {"TPU_WORKER_ID": str(spec.node_rank), "TPU_WORKER_HOSTNAMES": ",".join(group.addresses)}
    return {key: value for key, value in env.items() if not environ.get(key)}


def merged_hosts(spec: RunSpec, outcomes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The job's row from every host's ranks, in global rank order, and how far the hosts'
    medians spread (``host_skew_pct``: per step, each host's slowest rank)."""
    results = [result for host in range(spec.hosts) for result in outcomes[host]["ranks"]]
    row = merged_row(spec, results, [note for host in range(spec.hosts) for note in outcomes[host]["notes"]])
    medians = []
    for host in range(spec.hosts):
        steps = zip(*(r["steps"] for r in outcomes[host]["ranks"]), strict=True)
        slowest = [max(s["step_ms"] for s in rows) for rows in steps if rows[0]["phase"] == "measure"]
        medians.append(float(np.median(slowest)))
    metrics = json.loads(row["backend_metrics"])
    metrics["host_median_step_ms"] = medians
    return {
        **row,
        "host_skew_pct": (max(medians) - min(medians)) / float(np.median(medians)) * 100,
        "backend_metrics": json.dumps(metrics, sort_keys=True),
    }


def follow(ranks: list[Rank], channel: Any, abort_fd: int | None = None) -> dict[str, Any] | None:
    """Read every rank's channel until all have sent their results; forward rank 0's
    progress. Returns the failed row once a rank has failed or died (None: all ok).

    A failure is attributed only when every rank has settled (sent its result or exited),
    or :data:`SETTLE_S` after the first one: a rank killed by a signal breaks its peers'
    connections as it dies, and a peer's error can reach the launcher before the dead
    rank's closed channel does.

    ``abort_fd`` (a run over several hosts) becomes readable when another host has failed:
    this host's ranks are then killed at once, and the row says they were stopped."""
    settle_by = None
    with selectors.DefaultSelector() as selector:
        for rank in ranks:
            selector.register(rank.channel, selectors.EVENT_READ, rank)
        if abort_fd is not None:
            selector.register(abort_fd, selectors.EVENT_READ, None)
        while any(rank.result is None for rank in ranks):
            wait = 1.0 if settle_by is None else max(0.0, min(1.0, settle_by - time.monotonic()))
            events = selector.select(timeout=wait)
            for rank in ranks:  # a rank whose channel a forked grandchild still holds open
                if not events and not rank.closed and rank.result is None and rank.process.poll() is not None:
                    rank.closed = True
                    selector.unregister(rank.channel)
            for key, _ in events:
                rank = key.data
                if rank is None:  # the job ended elsewhere: another host failed, or host 0 went away
                    for each in ranks:
                        each.kill()
                    return {"status": "failed", "aborted": True, "error": "stopped: the run ended on another host"}
                chunk = os.read(rank.channel, 65536)
                if not chunk:
                    rank.closed = True
                    selector.unregister(rank.channel)
                    rank.process.wait()  # the channel closes when the rank exits
                    continue
                rank.take(chunk)
                if rank.local == 0:
                    for event in rank.events:
                        channel.send(event.pop("event"), **event)
                rank.events.clear()
            if settle_by is None and any(failed(rank) for rank in ranks):
                settle_by = time.monotonic() + SETTLE_S
            settled = all(rank.result is not None or rank.closed for rank in ranks)
            if settle_by is not None and (settled or time.monotonic() >= settle_by):
                return first_failure(ranks)
    return None


def failed(rank: Rank) -> bool:
    """Whether ``rank`` died without a result or sent one that is not ``ok``."""
    if rank.result is None:
        return rank.closed
    return rank.result.get("status") != "ok"


def first_failure(ranks: list[Rank]) -> dict[str, Any]:
    """The row of the rank whose failure started it (some rank failed): a rank that died
    (a peer's failure makes the others raise, never die), else the one that raised first
    (its peers' errors, lost connections and timeouts, come after it). Kills the others."""
    died = [rank for rank in ranks if failed(rank) and rank.result is None]
    raised = sorted((r for r in ranks if failed(r) and r.result is not None), key=lambda r: r.result_at)
    for rank in ranks:
        rank.kill()
    if died:
        rank = died[0]
        code = rank.process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code} and no result"
        row = {"status": "crashed", "error": f"rank {rank.index} {how}"}
    else:
        rank = raised[0]
        assert rank.result is not None
        row = dict(rank.result)
        if row["status"] in ("skipped", "unavailable"):  # every rank says the same: not a rank's fault
            return row
        row["error"] = f"rank {rank.index}: {row.get('error')}"
    # the runner keeps the tail of the worker's log for failed rows: the failed rank's output
    # goes there (rank 0 writes to that log itself)
    if tail := rank.tail():
        print(f"--- rank {rank.index}'s output (last {TAIL_LINES} lines) ---\n{tail}", file=sys.stderr, flush=True)
    return {**row, "failed_rank": rank.index, "tail": tail}


def wait_for_exit(ranks: list[Rank]) -> list[str]:
    """Let ranks that sent their results exit; notes for any that had to be killed."""
    deadline = time.monotonic() + EXIT_GRACE_S
    notes = []
    for rank in ranks:
        try:
            rank.process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            rank.kill()
            notes.append(f"rank {rank.index} sent its result but had not exited {EXIT_GRACE_S:g} s later; killed")
    return notes


# --- the merge -------------------------------------------------------------------------


def merge(spec: RunSpec, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's row from its ranks' rows (all ``ok``): rank 0's columns (identity, trace,
    ops, compiles), with the timing, throughput and serving columns computed again from
    the per-step slowest rank, and the per-rank figures."""
    base = dict(results[0])
    records = slowest_records(results)
    measured = merged_measurement(results, records)
    row = base | worker.timing_columns(measured)

    workload = worker.workload_for(spec)
    config = workload.config(spec.size)
    identity = {key: base.get(key) for key in (*worker.IDENTITY_COLUMNS, *worker.FLOPS_SOURCE)}
    metrics = json.loads(base.get("backend_metrics") or "{}")
    device = (base.get("device") or "", get_backend(spec.backend).device_kind)
    precision = metrics.get("float32_matmul_precision", "highest")
    row |= worker.throughput_columns(spec, workload, config, device, row["median_step_ms"], precision, identity)
    if spec.mode in ("prefill", "decode"):
        row |= merged_serving(spec, workload, config, device, results, records)
    row |= worker.per_device_columns(row, spec.devices)
    for share, ms in (("collective_share", "collective_ms"), ("exposed_collective_share", "exposed_collective_ms")):
        if base.get(ms) is not None:  # rank 0's time in collectives, as a share of the job's step
            row[share] = base[ms] / row["median_step_ms"]

    medians = [float(np.median([s["step_ms"] for s in r["steps"] if s["phase"] == "measure"])) for r in results]
    peaks = [r["peak_mem_bytes"] for r in results if r.get("peak_mem_bytes") is not None]
    metrics["rank_median_step_ms"] = medians
    return {
        **row,
        **job_columns(results),  # one host load and one host-busy warning for the job
        "rank_skew_pct": (max(medians) - min(medians)) / float(np.median(medians)) * 100,
        "peak_mem_bytes": max(peaks) if peaks else None,
        "peak_mem_bytes_min": min(peaks) if peaks else None,
        "backend_metrics": json.dumps(metrics, sort_keys=True),
        "steps": [{**step, "rank": index} for index, r in enumerate(results) for step in r["steps"]],
        **memory_merge(results),
        **energy_merge(results),
    }


def memory_merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's memory rows (its breakdown, its timeline), and the breakdown columns of
    the rank with the highest peak: the device that decides whether the job fits."""
    columns = (*PART_COLUMNS.values(), "memory_breakdown_source")
    fullest = max(results, key=lambda r: r.get("peak_mem_bytes") or 0)
    return {
        **{column: fullest.get(column) for column in columns},
        "memory": [{**row, "rank": index} for index, r in enumerate(results) for row in r.get("memory", [])],
    }


def energy_merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's energy: with every rank on its own GPU's NVML counter, the ranks' sum
    (energy per step and per token, power); otherwise rank 0's (a host's RAPL packages
    are shared by its ranks, so a sum would count them once per rank)."""
    if not all(r.get("energy_source") == NVML for r in results):
        return {}
    summed = ("energy_j", "joules_per_token", "joules_per_sample", "avg_power_w")
    return {
        column: sum(r[column] for r in results) if all(r.get(column) is not None for r in results) else None
        for column in summed
    }


STEP_FIELDS = [f.name for f in fields(StepRecord)]


def slowest_records(results: list[dict[str, Any]]) -> list[StepRecord]:
    """Per step, the job's record: the slowest rank's time (device and host), the most any
    rank had compiled; rank 0's XLA counters."""
    merged = []
    for rows in zip(*(r["steps"] for r in results), strict=True):
        record = StepRecord(**{name: rows[0][name] for name in STEP_FIELDS})
        record.step_ms = max(row["step_ms"] for row in rows)
        record.host_ms = max(row["host_ms"] for row in rows)
        record.compile_count = largest(row["compile_count"] for row in rows)
        record.compile_s = largest(row["compile_s"] for row in rows)
        merged.append(record)
    return merged


def largest(values: Any) -> Any:
    """The largest of the values that are known; None if none is."""
    known = [value for value in values if value is not None]
    return max(known) if known else None


def merged_measurement(results: list[dict[str, Any]], records: list[StepRecord]) -> Measurement:
    """The protocol's outcome for the job: the merged steps, and the most any rank compiled
    (the ranks warmed up together, so their step counts agree)."""
    return Measurement(
        first_step_s=records[0].step_ms / 1e3,
        first_step_compiles=largest(r.get("first_step_compiles") for r in results),
        warmup_steps=results[0]["warmup_steps"],
        compile_count=largest(r.get("compile_count") for r in results),
        recompiles_after_warmup=largest(r.get("recompiles_after_warmup") for r in results),
        compile_s=largest(r.get("compile_s") for r in results),
        warmup_settled=True,  # a rank that did not settle said so in its warnings, kept
        records=records,
    )


def merged_serving(
    spec: RunSpec,
    workload: Any,
    config: Any,
    device: tuple[str, str],
    results: list[dict[str, Any]],
    records: list[StepRecord],
) -> dict[str, Any]:
    """Serving columns of the job: each generation's TTFT is the slowest rank's and its end
    to end the merged step; inter-token latencies (not in the steps rows) the largest
    percentile any rank had."""
    if spec.mode == "prefill":
        timings = [GenerationTiming(ttft_ms=r.step_ms, e2e_ms=r.step_ms) for r in records]
    else:
        ttfts = [max(row["ttft_ms"] for row in rows) for rows in zip(*(r["steps"] for r in results), strict=True)]
        timings = [GenerationTiming(ttft_ms=t, e2e_ms=r.step_ms) for t, r in zip(ttfts, records, strict=True)]
    columns = worker.serving_columns(workload, config, spec, device, timings[-spec.steps :])
    for key in [key for key in columns if key.startswith("itl_")]:
        columns[key] = largest(r.get(key) for r in results)
    return columns
