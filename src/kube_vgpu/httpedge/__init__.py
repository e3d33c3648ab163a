"""HTTP serving for the webhook and the node plugin's metrics, on aiohttp's and asyncio's public API.

aiohttp's low-level server frames requests (`edge`); our accept loop counts connections from their
accept, holds them to a cap and a request deadline (`listener`); `metrics_server` serves `/metrics`
on a port of its own.
"""
