"""The search: rank 0 decides (``planner``), every rank measures (``controller``), the
budget and pruning (``budget``), the guided steps (``guided``) and the space they move in
(``searchspace``), the Optuna study (``study``), the confirmation and attribution at the
end (``finalists``), one configuration measured with repeats (``measurement``), and what
comes out (``result``). It returns results; it draws and writes nothing itself."""
