"""HTTP serving that a flood cannot take down, shared by the webhook and the node plugin.

aiohttp's low-level server with its own bounds (`edge`), behind our accept loop with the connection
cap, eviction and request deadline (`listener`), and a `/metrics` endpoint on a port of its own
built from both (`metrics_server`).
"""
