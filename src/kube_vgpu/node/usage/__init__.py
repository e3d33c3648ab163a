"""What the GPUs are really doing: NVML samples, attributed to containers through cgroups, as metrics."""
