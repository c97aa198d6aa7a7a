"""One rank of a multi-device run: ``python -m tpubench.launch.rank --channel-fd N``.

Started by :mod:`tpubench.launch.ranks` with torchrun's variables and ``TPUBENCH_RANK``
set, the run's request as stdin's first line; stdin then stays open as the lifeline (the
rank dies with its launcher). It measures with the worker's own ``measure()``, which
splits the model over the run's process group (:func:`tpubench.worker.apply_plan`), and
sends its result stamped with the time it was sent, so that the launcher can tell the
rank that failed first from the peers its failure took down.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
from typing import NoReturn

from tpubench import worker
from tpubench.ceilings import CeilingSpec
from tpubench.parallel import dtensor
from tpubench.spec import RunSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args()
    faulthandler.enable()  # a rank that aborts in C++ (a collective's thread) leaves its Python stack in the tail
    request = json.loads(sys.stdin.buffer.readline())
    worker.watch_parent(sys.stdin.fileno(), None)
    channel = worker.Channel(args.channel_fd)
    try:
        if request.get("kind") == "ceiling":  # a rank of a collective ceilings sweep
            result = worker.measure_ceiling(CeilingSpec.from_json(request["spec"]), channel)
        else:
            result = worker.measure(RunSpec.from_json(request["spec"]), channel)
    except Exception as error:
        traceback.print_exc()
        status = "oom" if worker.is_oom(error) else "failed"
        result = {"status": status, "error": f"{type(error).__name__}: {error}"}
    channel.send("result", result=result, at=time.monotonic())
    if result["status"] == "ok":  # after a failure a peer may be gone: the launcher kills the rest
        dtensor.finish()
    exit_rank()


def exit_rank() -> NoReturn:
    """End the rank's process without Python's finalization, once it has said all it had to.

    torch's gloo worker threads free a finished collective's tensors, which takes the GIL;
    one still doing so when the interpreter finalizes aborts the process ("terminate called
    without an active exception", in CI; here 3 times in 80 rank exits under gdb, with or
    without a barrier first). Leaving the group does not stop those threads while a module
    or a mesh still holds it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
