"""The search: rank 0 decides (``decider``), every rank measures (``controller``), the
budget and pruning (``budget``), the guided steps (``guided``), the pool of every run of a
configuration (``pool``), the finish at the end (``finish``: the finalists decided by the one
rule; ``path``: the attribution; ``recommend``: the decision in words; ``promises``: its
measured error rates), a search that cannot learn anything (``broken``), and what comes out
(``search_result``). Trials run through :mod:`tuner.runner`, the study is :mod:`tuner.study`,
the memory model :mod:`tuner.memory`. It returns results; it draws and writes nothing itself."""
