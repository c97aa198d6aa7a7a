"""TorchTPU's launch environment, as pure functions of the environment.

Every rank of a TorchTPU job must agree on variables decided before any rank starts: one
slice-builder ``host:port`` per rank, the physical topology, a profiling session id, and
on several hosts torchrun's ``NNODES``/``NODE_RANK``/``MASTER_ADDR``/``MASTER_PORT``.
``torch.tpu.distributed.set_tpu_launch_env`` decides them in the launcher by writing
``os.environ``; it scans the PCI bus and may start a child that opens the chips. tpubench
needs the same values without touching a device (the launcher is a worker that must
leave every chip to its ranks) and in tests without one, so this module restates its rules
(torch_tpu 0.2.0, ``_internal/distributed/distributed.py`` and ``utils/hardware.py``, read
from the wheel) as functions of the environment and of the chip generation tpubench
found on the PCI bus. ``tests/test_torchtpu_env.py`` checks them against the real function.

Rules: a variable already set is never replaced. Several hosts (more than one name in
``TPU_WORKER_HOSTNAMES``, ``nnodes`` > 1, or ``JOB_COMPLETION_INDEX`` set): addresses
``<host>:<TORCH_TPU_BASE_PORT (8070) + i>`` for ``TORCH_TPU_DEVICES_PER_HOST`` (default:
ranks per host) devices of every host, ``NNODES`` the host count, ``NODE_RANK`` the host's
place in the slice by its chips' coordinates (Z-major, X-minor, hosts of (2, 2, 1) chips)
when the slice topology is given, else ``JOB_COMPLETION_INDEX``, ``MASTER_ADDR`` the first
host, ``MASTER_PORT`` 29500. One host: ``localhost:<free port>`` per rank and the topology
of that many devices of the chip's generation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence

#: chips per host (x, y, z) of the slices multi-host jobs run on
CHIPS_PER_HOST = (2, 2, 1)
DEFAULT_BASE_PORT = 8070
DEFAULT_MASTER_PORT = "29500"
DEFAULT_DEVICES_PER_HOST = 8
#: one host's topology for a number of devices, per generation (TorchTPU's hardware table;
#: v5e and v6e have no 2-device topology; v7's devices are TensorCores, 2 per chip)
_SQUARE = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"}
_FLAT = {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"}
TOPOLOGIES = {
    "TPU v4": _SQUARE,
    "TPU v5p": _SQUARE,
    "TPU v5e": _FLAT,
    "TPU v6e": _FLAT,
    "TPU v7": {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
}


class LaunchEnvError(ValueError):
    """The environment does not say enough (or says contradicting things) to launch."""


def parse_topology(text: str) -> tuple[int, int, int]:
    """``"4x4x4"``, ``"2,2,1"``, ``"2,2,1,2"`` -> (x, y, z): later dimensions dropped, missing ones 1."""
    try:
        parts = [int(part) for part in re.split(r"[,xX]", text) if part]
    except ValueError:
        parts = []
    if not parts:
        raise LaunchEnvError(f"TORCH_TPU_TOPOLOGY must be integer dimensions separated by 'x' or ',', not {text!r}")
    parts += [1] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def host_coordinates(topology: str, chips_per_host: tuple[int, int, int] = CHIPS_PER_HOST) -> list[tuple[int, ...]]:
    """Every host of the slice, in node-rank order: Z-major, then Y, X-minor (JAX's order)."""
    bounds = [max(1, mesh // chips) for mesh, chips in zip(parse_topology(topology), chips_per_host, strict=True)]
    hosts = [(x, y, z) for x in range(bounds[0]) for y in range(bounds[1]) for z in range(bounds[2])]
    return sorted(hosts, key=lambda host: host[::-1])


def node_rank(
    coords: Sequence[int] | None,
    topology: str | None,
    fallback: str | None,
    chips_per_host: tuple[int, int, int] = CHIPS_PER_HOST,
) -> int:
    """This host's rank: where its chip's coordinates put it in the slice, else ``fallback``
    (``JOB_COMPLETION_INDEX``); neither is a LaunchEnvError."""
    hosts: list[tuple[int, ...]] = []
    if coords and topology:
        try:
            hosts = host_coordinates(topology, chips_per_host)
        except LaunchEnvError:
            if fallback is None:
                raise
        padded = [*coords, 0, 0, 0][:3]
        host = tuple(coordinate // chips for coordinate, chips in zip(padded, chips_per_host, strict=True))
        if host in hosts:
            return hosts.index(host)
    if fallback is not None:
        return int(fallback)
    if coords and topology:
        raise LaunchEnvError(f"TPU chip coordinates {list(coords)} lie outside the slice {topology!r}")
    raise LaunchEnvError(
        "no NODE_RANK: give the chip's coordinates with TORCH_TPU_TOPOLOGY, or JOB_COMPLETION_INDEX "
        "(the host's 0-based index, set by Kubernetes indexed jobs)"
    )


def launch_env(
    environ: Mapping[str, str],
    nproc_per_node: int,
    *,
    chip: str | None = None,
    host_devices: int = 0,
    nnodes: int | None = None,
    coords: Sequence[int] | None = None,
    pick_port: Callable[[], int],
    session_id: Callable[[], str] = lambda: str(time.time_ns()),
) -> dict[str, str]:
    """The variables ``set_tpu_launch_env(nnodes=nnodes, nproc_per_node=nproc_per_node)``
    would add to ``environ`` for ``nproc_per_node`` ranks on a host whose ``host_devices``
    devices are ``chip``s (``"TPU v6e"``; None and 0: no chip found) and, on several hosts,
    whose first chip sits at ``coords`` in the slice; ``pick_port`` gives a free local port.
    Variables ``environ`` has already are left out."""
    found: dict[str, str] = {}

    def once(name: str, value: Callable[[], str]) -> None:
        if name not in environ:
            found[name] = value()

    once("TORCH_TPU_XPROF_SESSION_ID", session_id)
    hosts = [host for host in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
    if nnodes is not None and hosts and nnodes != len(hosts):
        raise LaunchEnvError(f"nnodes is {nnodes}, but TPU_WORKER_HOSTNAMES names {len(hosts)} hosts")
    completion_index = environ.get("JOB_COMPLETION_INDEX")
    if (nnodes or 0) > 1 or len(hosts) > 1 or completion_index is not None:

        def required_hosts() -> list[str]:
            if not hosts:
                raise LaunchEnvError("TPU_WORKER_HOSTNAMES must list the job's hosts (comma-separated)")
            return hosts

        def addresses() -> str:
            base = int(environ.get("TORCH_TPU_BASE_PORT", DEFAULT_BASE_PORT))
            per_host = int(environ.get("TORCH_TPU_DEVICES_PER_HOST", nproc_per_node or DEFAULT_DEVICES_PER_HOST))
            return ",".join(f"{host}:{base + i}" for host in required_hosts() for i in range(per_host))

        slice_topology = environ.get("TORCH_TPU_TOPOLOGY")  # only one given from outside spans the slice
        once("TORCH_TPU_SLICEBUILDER_ADDRESSES", addresses)
        once("NNODES", lambda: str(nnodes if nnodes is not None else len(required_hosts())))
        once("NODE_RANK", lambda: str(node_rank(coords if slice_topology else None, slice_topology, completion_index)))
        once("MASTER_ADDR", lambda: required_hosts()[0])
        once("MASTER_PORT", lambda: DEFAULT_MASTER_PORT)
        if chip is not None and host_devices:  # this host's own topology, where it has chips
            once("TORCH_TPU_TOPOLOGY", lambda: single_host_topology(chip, host_devices))
        return found
    once(
        "TORCH_TPU_SLICEBUILDER_ADDRESSES", lambda: ",".join(f"localhost:{pick_port()}" for _ in range(nproc_per_node))
    )
    once("TORCH_TPU_TOPOLOGY", lambda: single_host_topology(chip, nproc_per_node))
    return found


def single_host_topology(chip: str | None, devices: int) -> str:
    """The topology of ``devices`` devices of one host of ``chip``s."""
    if chip is None:
        raise LaunchEnvError("no TPU chip on this host")
    table = TOPOLOGIES.get(chip)
    if table is None:
        raise LaunchEnvError(f"no known topology for {chip!r}; known: {', '.join(TOPOLOGIES)}")
    if devices not in table:
        raise LaunchEnvError(f"no {chip} topology of {devices} devices; valid: {', '.join(map(str, table))}")
    return table[devices]


def hosts_launch_env(
    environ: Mapping[str, str],
    nproc_per_node: int,
    *,
    hosts: int,
    node_rank: int,
    master: tuple[str, int],
    addresses: Sequence[str] = (),
    chip: str | None = None,
    host_devices: int = 0,
    pick_port: Callable[[], int],
    session_id: Callable[[], str] = lambda: str(time.time_ns()),
) -> dict[str, str]:
    """The launch environment of one host of a run over ``hosts`` hosts, for its
    ``nproc_per_node`` ranks: tpubench's own answers to what ``set_tpu_launch_env`` would
    otherwise derive (this host's index, host 0's rendezvous address, which tpubench found
    from ``--node-rank``/``--master`` or the launcher's variables), set as if given, so that
    its rules (:func:`launch_env`) decide the rest, the slice-builder addresses among them.
    ``TPU_WORKER_HOSTNAMES``, where the environment lacks it (Ray, Slurm), lists the hosts'
    ``addresses`` as they joined."""
    given = {
        "NNODES": str(hosts),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
    }
    if not environ.get("TPU_WORKER_HOSTNAMES") and addresses:
        given["TPU_WORKER_HOSTNAMES"] = ",".join(addresses)
    given = {key: value for key, value in given.items() if key not in environ}
    found = launch_env(
        {**environ, **given},
        nproc_per_node,
        chip=chip,
        host_devices=host_devices,
        nnodes=hosts,
        pick_port=pick_port,
        session_id=session_id,
    )
    return {**given, **found}
