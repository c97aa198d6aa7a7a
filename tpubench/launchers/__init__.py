"""Where a suite's runs execute besides this machine: ``ray`` (``tpubench run --on ray``).

The local loop is :meth:`tpubench.runner.SuiteRunner.run`; every launcher measures through
the same :class:`tpubench.runner.Executor`, so a run is the same measurement wherever it runs.
"""
