"""What TorchTPU's own launch-environment code says, for tests/test_torchtpu_env.py.

Run as ``python tests/torchtpu_rules.py CASES_JSON`` with the scenario's environment; no
TPU chip is needed (none is opened). Prints JSON: the variables ``set_tpu_launch_env``
added (with ``nproc_per_node`` from the cases, or its error), and its private helpers'
answers for each case: ``_get_slice_host_coordinates(topology)`` and
``_calculate_topological_node_rank(coords, topology, fallback)``. With ``single_host_chip``
the PCI scan is replaced by that many devices of that generation (the one faked part:
there is no chip here).
"""

from __future__ import annotations

import json
import os
import sys

cases = json.loads(sys.argv[1])
before = dict(os.environ)
from torch_tpu._internal.distributed import distributed  # noqa: E402 (after the environment is read)
from torch_tpu._internal.utils import hardware  # noqa: E402

if fake := cases.get("single_host_chip"):
    table = {"TPU v6e": hardware._V6E_TOPOLOGY, "TPU v4": hardware._V4_TOPOLOGY}[fake["chip"]]
    hardware._scan_pci_tpus = lambda: (fake["devices"], table)
try:
    distributed.set_tpu_launch_env(nproc_per_node=cases["nproc_per_node"])
    added = {key: value for key, value in os.environ.items() if before.get(key) != value}
    launch = {"env": {key: value for key, value in added.items() if key.startswith(("TORCH_TPU_", "N", "MASTER_"))}}
except ValueError as error:
    launch = {"error": str(error)}


def node_rank(case: list) -> int | str:
    try:
        return distributed._calculate_topological_node_rank(*case)
    except ValueError:
        return "error"


print(
    json.dumps(
        {
            "launch": launch,
            "hosts": {t: distributed._get_slice_host_coordinates(t) for t in cases.get("topologies", [])},
            "node_ranks": [node_rank(case) for case in cases.get("node_ranks", [])],
        }
    )
)
