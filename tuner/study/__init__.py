"""The study a search keeps, behind the tuner's own interface (``study``: ask, tell, enqueue,
records; ``record``: what a trial was), how trials are recorded and which count
(``records``), the space and how one point is asked of it (``searchspace``), several workers
on one study (``workers``). Optuna is imported here only, by three modules: ``study``,
``backend`` (its storage and trial ids) and ``storage`` (storage faults retried or said)."""
