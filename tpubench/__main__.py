"""``python -m tpubench`` is the ``tpubench`` command."""

from tpubench.console import main

main()
