"""Starting processes: a run's worker, and a multi-device run's rank processes.

:mod:`.process` starts a worker (forked from the :mod:`.zygote` or a fresh interpreter) with
a deadline and classifies how it ended; :mod:`.serve` is what a worker process carries out;
:mod:`.ranks` makes a multi-device run's worker the launcher of N rank interpreters
(:mod:`.rank`) and merges their rows; on several hosts, :mod:`.hosts` is the rendezvous
of the hosts' workers before each starts its own share of the ranks. :mod:`.engine` starts a serving
engine (vLLM, SGLang, ``transformers serve``) in its own process group and stops it with
nothing left behind. Everything here sits above :mod:`tpubench.worker`,
which measures in one process and starts nothing.
"""
