"""Reaching a user's code by reference: ``pkg.mod:fn`` or ``/abs/path/file.py:fn``, and the
``--model-config`` values.

A file is imported under a module name derived from its absolute path, so every worker, in
whatever process or interpreter, gives the same file the same name (and a second import in
one process is the first one, from ``sys.modules``). Its folder is appended to ``sys.path``,
so the file can import its siblings as it would when run as a script, without shadowing
anything already importable.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from workloads.custom.ref import ModelRefError


def split_reference(reference: str) -> tuple[str, str]:
    """``module:function`` -> (module, function); the module may be a path to a ``.py`` file."""
    module, sep, function = reference.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise ModelRefError(
            f"{reference!r} is not a function reference; write pkg.module:function or /path/to/file.py:function"
        )
    return module, function


def file_module_name(path: Path) -> str:
    """The stable module name of a file imported by path: the same in every interpreter."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"tpubench_user_{stem}_{digest}"


def import_module(module: str) -> ModuleType:
    """Import ``module`` (a dotted name, or a path to a ``.py`` file); every failure is a ModelRefError."""
    if module.endswith(".py") or "/" in module:
        return import_file(Path(module))
    try:
        return importlib.import_module(module)
    except ModelRefError:
        raise
    except Exception as error:  # the user's module: any exception while importing it is their bug
        raise ModelRefError(f"module {module!r} does not import: {type(error).__name__}: {one_line(error)}") from error


def import_file(path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ModelRefError(
            f"file {str(path)!r} does not exist; give an existing .py file as /path/to/file.py:function"
        )
    name = file_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise ModelRefError(f"file {str(path)!r} does not import: {type(error).__name__}: {one_line(error)}") from error
    return module


def load_function(reference: str, what: str) -> Callable[..., Any]:
    """The callable ``reference`` names; ``what`` says what it is for (``factory``, ``inputs``)."""
    module_name, function = split_reference(reference)
    module = import_module(module_name)
    found = getattr(module, function, None)
    if found is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ModelRefError(
            f"{what} {function!r} not found in {module_name!r}; its callables: {', '.join(public) or 'none'}"
        )
    if not callable(found):
        raise ModelRefError(f"{what} {reference!r} is a {type(found).__name__}, not a callable")
    return found


def source_digest(functions: list[Callable[..., Any]]) -> str:
    """A hash of the source files defining ``functions``, by their contents alone: a changed
    model gets a new identity, and the same file reached by another path (a module name or a
    file's path, another checkout) keeps it."""
    contents = set()
    for function in functions:
        path = inspect.getsourcefile(inspect.unwrap(function))
        if path and Path(path).is_file():
            contents.add(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        else:  # no source to read (a compiled module): its name is all there is
            contents.add(f"{getattr(function, '__module__', '')}:{getattr(function, '__qualname__', '')}")
    return hashlib.sha256("|".join(sorted(contents)).encode()).hexdigest()


def parse_value(text: str) -> Any:
    """A ``--model-config`` value: JSON where it parses (ints, floats, ``true``, lists), Python's
    ``True``/``False``/``None`` spelled as such, else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(text, text)


def same_value(default: Any, value: Any) -> bool:
    """Whether an override's value is the default's (``1`` is not ``True``, nor ``1.0``)."""
    return type(default) is type(value) and default == value


def parse_overrides(pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    return {key: parse_value(value) for key, value in pairs}


def one_line(error: BaseException) -> str:
    """An exception's message on one line (an ``error:`` line must be one line)."""
    return " ".join(str(error).split()) or type(error).__name__
