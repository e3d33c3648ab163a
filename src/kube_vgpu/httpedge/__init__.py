"""HTTP serving for the webhook and the node plugin's metrics, on aiohttp's and asyncio's public API:
`listener` accepts, caps and times connections; `metrics_server` serves `/metrics` on a port of its own."""
