"""A run's precision (``--precision``, docs/precision.md).

Three modules, each in its own layer (pyproject's import contract): :mod:`.choices` (the
precisions, torch-free, beside :mod:`tpubench.spec`), :mod:`.convert` (torchao's public API
applied to a built model, beside :mod:`tpubench.measure`) and :mod:`.quality` (the
divergence from bf16 of the same seed and inputs, beside :mod:`tpubench.verify`). This file
imports none of them, so that importing the choices never imports torch.
"""
