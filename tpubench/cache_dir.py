"""Where tpubench keeps figures it can always compute again but would rather not:
``TPUBENCH_CACHE_DIR``, default ``~/.cache/tpubench`` (``tpubench list``'s parameter counts,
the FLOPs and bytes of the shapes a trace recorded). A leaf every module may import.

A kept file is ``{"key": ..., "counts": {...}}``: the key says what the counts are valid for
(the sources and torch build they were counted with), and counts kept under another key are
counted again. Nothing in the folder is needed: a missing or unreadable file, or one that
cannot be written, only costs the counting again."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """The folder for kept counts."""
    return Path(os.environ.get("TPUBENCH_CACHE_DIR") or Path.home() / ".cache" / "tpubench")


def read_kept(name: str, key: str) -> dict[str, Any]:
    """The counts kept in the cache folder's ``name`` under ``key``; empty where the file is
    missing, unreadable, or kept under another key."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        found = json.loads((cache_dir() / name).read_text())
        if isinstance(found, dict) and found.get("key") == key and isinstance(found.get("counts"), dict):
            return found["counts"]
    return {}


def keep(name: str, key: str, counts: dict[str, Any]) -> None:
    """Keep ``counts`` under ``key`` in the cache folder's ``name``, atomically (a reader sees
    the old file or the new one); where it cannot be written (a read-only home), nothing is
    kept and the next call counts again."""
    path = cache_dir() / name
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "counts": counts}))
        partial.replace(path)
