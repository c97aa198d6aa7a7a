"""The ``tpubench`` entry point, kept free of torch imports on purpose.

The parent process only plans and stores, so an installed TPU plugin (torch_tpu) must not
autoload into it: the variable has to be set before anything imports torch.
"""

import atexit
import contextlib
import faulthandler
import itertools
import os
import signal
import sys

#: commands that start workers: their fork server boots while this process imports the CLI
WORKER_COMMANDS = ("run", "env", "ci")


def main() -> None:
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: where a stuck tpubench is
    if len(sys.argv) > 1 and sys.argv[1] in WORKER_COMMANDS and _workers_start_here(sys.argv):
        from tpubench.launch.process import prestart

        prestart()  # the zygote imports torch on one core while the CLI imports on the other
    from tpubench.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as exit_:
        code = exit_.code
    else:
        code = 0
    _exit(code)


def _workers_start_here(argv: list[str]) -> bool:
    """Whether this process's workers will fork from a fork server started with its environment
    as it is now. Not with ``--on ray``, whose actors start their own on their nodes, nor with
    ``ci --threads``, ``--model`` or ``--workload-module``, which change the workers'
    environment first (the thread count; the import path and the plugin modules): a fork
    server started here would only take a core from the start-up."""
    on_ray = "--on=ray" in argv or any(a == "--on" and b == "ray" for a, b in itertools.pairwise(argv))
    changes_env = ("--threads", "--model", "--workload-module")
    return not (on_ray or any(a in changes_env or a.startswith(tuple(f"{o}=" for o in changes_env)) for a in argv))


def _exit(code: int | str | None) -> None:
    """Exit without tearing down the imported modules.

    Everything has been written and flushed by now, and the interpreter's teardown of
    torch, pandas and pyarrow cost about 0.6 s per invocation here, more than a tiny run's
    measured steps. Exit handlers (closing the fork server, Ray) still run.
    """
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):  # a closed pipe (tpubench ... | head)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code or 0)
