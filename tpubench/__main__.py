"""``python -m tpubench`` is the ``tpubench`` command."""

from tpubench.cli import main

main()
