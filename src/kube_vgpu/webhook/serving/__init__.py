"""The webhook's HTTPS edge: TLS, the listener and its connection cap, the endpoints, metrics."""
