"""What tpubench knows about one serving engine: how to start it and what it accepts.

An :class:`Engine` is a declaration, never a running process (``tpubench.launch.engine``
starts and stops one). It says how to start the engine on 127.0.0.1 and a port, what
"ready" means (the path that answers 200 once the model is loaded), where its version is
read, which request fields and start flags it honours, and whether it is installed here,
with how to install it where not. Each engine's facts say where they come from: run here,
or read from the engine's documentation and not yet run on a chip (docs/serving.md).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import shutil
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
#: the request fields and start flags whose support is recorded per engine (the ``honoured``
#: column): a field an engine does not honour is left out of its requests, since some
#: engines refuse a field they do not know (``transformers serve`` answers 422)
HONOURED_FIELDS = ("ignore_eos", "stream_options", "load_format_dummy")
#: an engine's settings that a serving row keeps, read from its arguments
SETTINGS = ("dtype", "tp_size", "quantization")


@dataclass(frozen=True)
class Engine:
    """One ``--engine`` choice."""

    name: str
    summary: str
    #: how the server is started, before the model: a console script and its subcommand
    #: (``("vllm", "serve")``) or ``("-m", module)`` run by this interpreter
    launcher: tuple[str, ...]
    #: the flag the model follows (``--model-path``); None: the model is positional
    model_flag: str | None
    #: modules this interpreter must find for the engine to run here
    modules: tuple[str, ...]
    install: str
    honours: Mapping[str, bool]
    #: the engine's own flags for each of :data:`SETTINGS`
    flags: Mapping[str, tuple[str, ...]]
    #: the kind of chip it serves on: "cuda", "tpu", or "device-flag" (its ``--device``, as
    #: ``transformers serve`` has it; auto: a GPU where there is one, else the CPU)
    accelerator: str
    #: where the facts above come from: the engine's documentation (a URL) ...
    docs: str
    #: ... and, where it was run, what on (None: read from the documentation only)
    verified: str | None = None
    ready_path: str = "/health"
    #: paths whose JSON answer carries the version under "version", tried in order
    version_paths: tuple[str, ...] = ()
    #: distributions whose installed versions make the version where no path gives one, or
    #: that are added to it (a platform plugin beside vLLM's own version)
    version_packages: tuple[str, ...] = ()
    #: arguments always given (``--continuous-batching``), before the user's own
    default_args: tuple[str, ...] = ()
    #: variables set in the engine's environment over the caller's (as a backend's worker env is)
    env: Mapping[str, str] = field(default_factory=dict)

    def missing(self) -> str | None:
        """Why the engine cannot start here (not installed, and how to install it); None if it can."""
        absent = [module for module in self.modules if importlib.util.find_spec(module) is None]
        if self.launcher[0] != "-m" and _program(self.launcher[0]) is None:
            absent.append(f"the {self.launcher[0]} command")
        if not absent:
            return None
        return f"engine {self.name} is not installed here ({', '.join(absent)} missing): {self.install}"

    def argv(self, model: str, port: int, engine_args: Sequence[str] = ()) -> list[str]:
        """The command line that serves ``model`` on 127.0.0.1:``port``."""
        if self.launcher[0] == "-m":
            command = [sys.executable, *self.launcher]
        else:
            command = [_program(self.launcher[0]) or self.launcher[0], *self.launcher[1:]]
        command += [self.model_flag, model] if self.model_flag else [model]
        return [*command, "--host", HOST, "--port", str(port), *self.default_args, *engine_args]

    def settings(self, engine_args: Sequence[str]) -> dict[str, str | int | None]:
        """The row's dtype, tensor-parallel size and quantization, as the arguments set them
        (None where they do not: the engine's own default, unknown here)."""
        found: dict[str, str | int | None] = {}
        for setting in SETTINGS:
            value = flag_value(engine_args, self.flags.get(setting, ()))
            found[setting] = int(value) if setting == "tp_size" and value is not None and value.isdigit() else value
        return found

    def version(self, served: str | None) -> str | None:
        """The version to store: what the engine's version path gave (``served``), else its first
        package's installed version, followed by any platform plugin's (``"0.11.0, tpu-inference
        0.11.0"``)."""
        installed = []
        for package in self.version_packages:
            try:
                installed.append(f"{package} {importlib.metadata.version(package)}")
            except importlib.metadata.PackageNotFoundError:
                installed.append(None)
        first = served or (installed[0].split(" ", 1)[1] if installed and installed[0] else None)
        plugins = [text for text in installed[1:] if text]
        return ", ".join([first, *plugins]) if first else None


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of ``names`` in ``args`` (``--dtype bf16`` or ``--dtype=bf16``)."""
    value = None
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def param_count(model: str) -> int | None:
    """The parameters of a model in a local folder, counted from its safetensors files' headers
    (no weights read, no torch); None for a hub id or a folder without safetensors files."""
    files = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    total = 0
    for path in files:
        try:
            with open(path, "rb") as stream:
                (size,) = struct.unpack("<Q", stream.read(8))
                header = json.loads(stream.read(size))
        except (OSError, ValueError, struct.error):
            return None
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total if files else None


def _program(name: str) -> str | None:
    """A console script: this interpreter's own (its environment's ``bin``) first, then PATH's."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)
