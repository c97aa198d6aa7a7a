"""The ``tpubench`` entry point, kept free of torch imports on purpose.

The parent process only plans and stores, so an installed TPU plugin (torch_tpu) must not
autoload into it: the variable has to be set before anything imports torch.
"""

import os
import sys

#: commands that start workers: their fork server boots while this process imports the CLI
WORKER_COMMANDS = ("run", "env", "ci")


def main() -> None:
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    if len(sys.argv) > 1 and sys.argv[1] in WORKER_COMMANDS:
        from tpubench.process import prestart

        prestart()  # the zygote imports torch on one core while the CLI imports on the other
    from tpubench.cli import main as cli_main

    cli_main()
