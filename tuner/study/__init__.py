"""The Optuna study a search keeps: opening it and recording trials (``records``), the
space as Optuna distributions (``searchspace``), storage faults retried or said in one line
(``storage``), several workers on one study (``workers``), and the one module that reaches
into Optuna's storage (``backend``)."""
