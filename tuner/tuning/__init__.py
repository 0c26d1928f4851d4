"""The search: rank 0 decides (``decider``), every rank measures (``controller``), the
budget and pruning (``budget``), the guided steps (``guided``), the pool of every run of a
configuration (``pool``), the confirmation and attribution at the end (``finalists``,
``recommend``), a search that cannot learn anything (``broken``), and what comes out
(``search_result``). Trials run through :mod:`tuner.runner`, the study is :mod:`tuner.study`,
the memory model :mod:`tuner.memory`. It returns results; it draws and writes nothing itself."""
