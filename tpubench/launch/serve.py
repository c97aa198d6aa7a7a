"""The worker process: carries out one request (a probe, a run, a --verify output, a
ceilings sweep) and reports over a pipe.

Started by :mod:`.process`, forked from the zygote or as ``python -m tpubench.launch.serve
--channel-fd N`` with a JSON request as the first line on stdin. A one-process run is
measured here by :func:`tpubench.worker.measure`; a multi-device run of a process family
makes this process the launcher of its ranks (:mod:`.ranks`). A crash or hang here costs
only this run, and the worker dies with its parent (:func:`tpubench.worker.watch_parent`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

from tpubench import ceilings, parallel, worker
from tpubench.backends import BACKENDS
from tpubench.ceilings import collective
from tpubench.launch import ranks
from tpubench.spec import RunSpec


def measure(spec: RunSpec, channel: worker.Channel) -> dict[str, Any]:
    """The run's own process: refuse a tensor-parallel run its workload cannot split (once,
    before any rank or model starts), launch the ranks of a multi-process run, or measure here."""
    if reason := worker.tensor_parallel_refusal(spec):
        return {"status": "skipped", "error": reason}
    if parallel.is_multi_process(spec):
        return ranks.measure_ranks(spec, channel)
    if spec.hosts > 1:  # torch_xla's SPMD over several hosts: this process is its host's share
        return ranks.measure_spmd_hosts(spec, channel)
    return worker.measure(spec, channel)


def measure_ceiling(spec: ceilings.CeilingSpec, channel: worker.Channel) -> dict[str, Any]:
    """A ceilings sweep: a collective of a process family in rank processes, started as a
    multi-device run's are, its ranks' results merged per sample into the slowest rank's;
    every other sweep in this process."""
    if not ceilings.is_multi_process(spec):
        return worker.measure_ceiling(spec, channel)
    started = time.perf_counter()
    try:
        outcome = ranks.run_host(spec, channel, kind="ceiling")
        if outcome["status"] == "ok":  # with the launcher's note of any rank it had to kill
            result = collective.merge(spec, outcome["ranks"])
            result["warnings"] = "\n".join(filter(None, [result.get("warnings"), *outcome["notes"]])) or None
        else:  # the rank that failed first
            result = ranks.failed_row(outcome)
    except Exception as error:
        traceback.print_exc()
        result = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    result["worker_wall_s"] = time.perf_counter() - started
    return result


def serve(request: dict[str, Any], channel_fd: int, lifeline_fd: int, scratch: str | None = None) -> None:
    """Carry out one request (a probe, a run, a --verify output or a ceilings sweep) and send
    its result."""
    worker.watch_parent(lifeline_fd, scratch)
    channel = worker.Channel(channel_fd)
    if request["kind"] == "probe":
        channel.send("result", result=worker.probe(request.get("backends") or list(BACKENDS)))
        return
    if request["kind"] == "ceiling":
        channel.send("result", result=measure_ceiling(ceilings.CeilingSpec.from_json(request["spec"]), channel))
        return
    spec = RunSpec.from_json(request["spec"])
    if request["kind"] == "verify":
        channel.send("result", result=worker.verify_outputs(spec, request["output"]))
        return
    started = time.perf_counter()
    try:
        result = measure(spec, channel)
    except Exception as error:
        traceback.print_exc()
        status = "oom" if worker.is_oom(error) else "failed"
        result = {"status": status, "error": f"{type(error).__name__}: {error}"}
    result["worker_wall_s"] = time.perf_counter() - started
    channel.send("result", result=result)


def main() -> None:
    """A fresh interpreter's worker: the request is stdin's first line, then stdin is the lifeline."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args()
    request = json.loads(sys.stdin.buffer.readline())
    serve(request, args.channel_fd, sys.stdin.fileno(), request.get("scratch"))


if __name__ == "__main__":
    main()
