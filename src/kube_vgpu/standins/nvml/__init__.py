"""A simulated NVML with the surface of the `pynvml` module, for machines with no GPU."""
