"""Several hosts: which one this process is, and where host 0 listens, from the options or
from the environment that the user's launcher sets.

Every host runs the same ``tpubench run ... --hosts N --devices D`` (``D`` the total, ``D / N``
on each host). The hosts meet at a rendezvous store on host 0 (:mod:`tpubench.launch.hosts`,
as torchrun's c10d rendezvous does); for that each needs its own index and host 0's address:

- the index: ``--node-rank``, else ``JOB_COMPLETION_INDEX`` (a Kubernetes Indexed Job or
  JobSet), ``SLURM_NODEID`` (``srun``), ``TPU_WORKER_ID`` (a TPU VM slice, GKE);
- host 0's address: ``--master HOST:PORT``, else the first of ``TPU_WORKER_HOSTNAMES``,
  ``MASTER_ADDR``, or the first host of Slurm's node list (``SLURM_JOB_NODELIST``), at
  ``MASTER_PORT`` or :data:`DEFAULT_PORT` (torchrun's and TorchTPU's).

Torch-free, like the rest of the plan: the CLI decides here, before anything runs, and a
missing or contradicting answer is a :class:`HostsError` whose one line names the choices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

#: the rendezvous port when only host 0's name is known (torchrun's and TorchTPU's MASTER_PORT)
DEFAULT_PORT = 29500
#: where the user's launcher says which host this is, in the order they are read
NODE_RANK_SOURCES = ("JOB_COMPLETION_INDEX", "SLURM_NODEID", "TPU_WORKER_ID")
#: Slurm's list of the job's nodes (``node[01-04],gpu7``)
SLURM_NODELISTS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


class HostsError(ValueError):
    """The options and the environment do not say which host this is, or where host 0 is."""


@dataclass(frozen=True)
class HostPlace:
    """This host's index among ``hosts`` and host 0's rendezvous address, and where each came from."""

    hosts: int
    node_rank: int
    master: str  # HOST:PORT
    node_rank_from: str
    master_from: str


def parse_master(text: str, option: str = "--master") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port)."""
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", text.strip())
    if not match:
        raise HostsError(f"{option} expects HOST:PORT (host 0's address and a free port there), got {text!r}")
    host, port = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    if not 0 < int(port) < 2**16:
        raise HostsError(f"{option} {text}: the port must be 1 to 65535")
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def slurm_first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[03-05,9],x`` -> ``node03``."""
    first = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist.strip())
    assert first is not None  # the pattern matches any string
    prefix, ranges = first.group(1), first.group(3)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def find_node_rank(given: int | None, environ: Mapping[str, str]) -> tuple[int, str]:
    if given is not None:
        return given, "--node-rank"
    for name in NODE_RANK_SOURCES:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise HostsError(f"{name}={value!r} is not a host index (a non-negative integer)")
            return int(value), name
    raise HostsError(
        "which host is this? give --node-rank K (0 on the host whose address --master names), or run under a "
        f"launcher that sets one of {', '.join(NODE_RANK_SOURCES)}"
    )


def find_master(given: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """Host 0's rendezvous ``HOST:PORT`` and where it came from."""
    if given is not None:
        return join_address(*parse_master(given)), "--master"
    port = environ.get("MASTER_PORT", "").strip() or str(DEFAULT_PORT)
    if not port.isdigit():
        raise HostsError(f"MASTER_PORT={port!r} is not a port number")
    names = [name.strip() for name in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if name.strip()]
    if names:
        return join_address(names[0], int(port)), "TPU_WORKER_HOSTNAMES"
    if environ.get("MASTER_ADDR", "").strip():
        return join_address(environ["MASTER_ADDR"].strip(), int(port)), "MASTER_ADDR"
    for name in SLURM_NODELISTS:
        if environ.get(name, "").strip():
            return join_address(slurm_first_host(environ[name]), int(port)), name
    raise HostsError(
        "where is host 0? give --master HOST:PORT (the same on every host), or set TPU_WORKER_HOSTNAMES, "
        f"MASTER_ADDR (with MASTER_PORT, default {DEFAULT_PORT}) or run under Slurm"
    )


def place(hosts: int, node_rank: int | None, master: str | None, environ: Mapping[str, str]) -> HostPlace:
    """Where this host stands in a run over ``hosts`` hosts: the options first, then the
    environment of the user's launcher."""
    rank, rank_from = find_node_rank(node_rank, environ)
    if rank >= hosts:
        raise HostsError(
            f"{rank_from} {rank} is not a host of --hosts {hosts}: valid host indexes are 0 to {hosts - 1}"
        )
    address, master_from = find_master(master, environ)
    return HostPlace(hosts, rank, address, rank_from, master_from)


def check_hosts(devices: list[int], hosts: int) -> None:
    """Each host drives the same number of devices: ``hosts`` must divide every device count."""
    if hosts < 1:
        raise HostsError(f"--hosts expects a positive integer, got {hosts}")
    if hosts == 1:
        return
    for count in devices:
        if count % hosts:
            valid = ", ".join(str(h) for h in range(1, count + 1) if count % h == 0)
            raise HostsError(
                f"--hosts {hosts} does not divide --devices {count} (the total; every host drives the same "
                f"number); valid --hosts for {count} devices: {valid}"
            )
