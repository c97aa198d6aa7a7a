"""Serving: an engine under request load, measured with vLLM's definitions (docs/serving.md).

``metrics`` holds the definitions (TTFT, TPOT, ITL, E2EL, goodput) that both the engine
sweeps and the in-process decode mode use; the client, the arrival process, the datasets,
one module per engine and the importers of other tools' results live beside it. Its
modules sit at different layers (pyproject.toml's contract): the definitions at the bottom,
the sweep that starts engines at the runner's level.
"""
