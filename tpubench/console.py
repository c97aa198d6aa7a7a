"""The ``tpubench`` entry point, kept free of torch imports on purpose.

The parent process only plans and stores, so an installed TPU plugin (torch_tpu) must not
autoload into it: the variable has to be set before anything imports torch.
"""

import os


def main() -> None:
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    from tpubench.cli import main as cli_main

    cli_main()
