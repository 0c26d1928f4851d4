"""The measuring harness: the probe core (``probe``), the metric definitions (``metrics``),
samplers (``monitors``: PSS, NVML), exposed communication (``comm``), FLOPs and peaks
(``flops``), NVTX ranges (``nvtx``), the environment record (``environment``), the
Prometheus endpoint (``prometheus``) and the process group (``distributed``). It knows
nothing of searches or script mode."""
