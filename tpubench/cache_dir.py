"""Where tpubench keeps figures it can always compute again but would rather not:
``TPUBENCH_CACHE_DIR``, default ``~/.cache/tpubench`` (``tpubench list``'s parameter counts,
the FLOPs and bytes of the shapes a trace recorded). A leaf every module may import."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The folder for kept counts; nothing in it is needed (a missing or unreadable file is
    counted again)."""
    return Path(os.environ.get("TPUBENCH_CACHE_DIR") or Path.home() / ".cache" / "tpubench")
