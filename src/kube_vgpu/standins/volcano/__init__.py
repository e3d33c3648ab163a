"""LOCAL STAND-IN for Volcano's vGPU scheduling: device ConfigMap, fit, node lock, bind."""
