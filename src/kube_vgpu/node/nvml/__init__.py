"""The node's GPUs through NVML: discovery, health, and the inventory the running plugin keeps."""
