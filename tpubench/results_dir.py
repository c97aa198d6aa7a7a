"""Where results go by default, and whether a ``--results`` names object storage.

Apart from :mod:`tpubench.store` because that module imports pandas and pyarrow (0.4 s
here), and ``tpubench run --on ray`` asks Ray for its actors before it needs either: every
command's options name the default, and ``--results`` is checked as it is parsed.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_RESULTS_DIR = Path("results")


def is_remote(results: str | Path) -> bool:
    """Whether ``results`` names object storage (``s3://...``) rather than a local directory."""
    return "://" in str(results) and not str(results).startswith("file://")
