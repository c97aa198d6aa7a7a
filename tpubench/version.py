"""tpubench's version: a leaf every module may import (fingerprints and records carry it)."""

__version__ = "0.1.0"
