"""Pure functions of results: why a configuration runs at its speed (``diagnose``), which
knob bought how much (``attribution``), whether reduced precision still trains the same
model (``guard``), and the regression gate's verdict (``gate``). No measuring, no storage."""
