"""Where a suite's runs execute besides this machine: ``ray`` (``tpubench run --on ray``).

The local loop is :meth:`tpubench.runner.SuiteRunner.run`; every launcher measures through
the same :class:`tpubench.runner.Executor`, so a run is the same measurement wherever it runs.
"""

import os

# A launcher's processes play the parent's part (a Ray actor probes and starts the run's
# worker), so an installed TPU plugin must not autoload into them, which would take the
# chip from the run's own worker. tpubench itself imports no torch there; this covers
# anything else that does. Set here rather than in a Ray runtime_env: an actor or task with
# a runtime_env cannot use Ray's ordinary worker processes and waits for dedicated ones.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
