"""Where a run's trace is on disk: a Chrome trace file, or an XProf logdir of xplanes.

Its own module so that the readers (:mod:`.collectives`) and the package's :func:`ingest`
find traces the same way without importing each other.
"""

from __future__ import annotations

from pathlib import Path

from tpubench.traces.timeline import TraceError

XPLANE_SUFFIX = ".xplane.pb"


def locate(trace_path: Path) -> list[Path]:
    """The files to read for a run's ``trace_path``: a Chrome trace file, or the xplane(s) of
    the newest session under an XProf logdir (``plugins/profile/<session>/*.xplane.pb``,
    one per host)."""
    path = Path(trace_path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TraceError(f"trace {path} does not exist")
    sessions = sorted({found.parent for found in path.rglob(f"*{XPLANE_SUFFIX}")})
    if not sessions:
        raise TraceError(f"no *{XPLANE_SUFFIX} under {path}")
    return sorted(sessions[-1].glob(f"*{XPLANE_SUFFIX}"))
