"""Dynamic MIG: the scheduler's geometry, where slots live on each GPU, and instances made through NVML."""
