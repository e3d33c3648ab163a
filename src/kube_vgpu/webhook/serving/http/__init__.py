"""The webhook's HTTP/1.1 edge: framing, limits and keep-alive for each TLS connection.

`connection` serves one connection (parsing with httptools, llhttp's bindings), `decoding` turns a
compressed body back into bytes within the body limit, `message` holds the request and response
the handlers see. Which connections exist at all is `webhook.listener`'s concern; what a request
means is `webhook.server`'s.
"""
