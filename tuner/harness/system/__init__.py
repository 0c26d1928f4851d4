"""What the machine is and does beside the measured loop: the process tree's memory, NVML,
CPU use (``monitors``), the device's free memory (``devices``), the recorded environment
(``environment``), peak FLOP/s per device (``flops``), the Prometheus exporter
(``prometheus``)."""
