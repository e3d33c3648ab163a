"""The admission endpoints on the shared HTTP edge (`kube_vgpu.httpedge`): TLS reload, body budget,
routing of /mutate, /validate and the health checks, and the webhook's metrics."""
