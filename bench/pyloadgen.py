#!/usr/bin/env python3
"""A stand-in for bench/gofloor's loadgen where no Go toolchain is installed: the same flags, the
same requests (the body's AdmissionReview with a fresh uid each) over TLS keep-alive, and the same
JSON line (rps, p50_ms, p99_ms, errors). Python threads send slower than Go, so its rps and
latencies are not comparable with the Go load generator's; the server's CPU per review is.

    .venv/bin/python bench/webhook.py --loadgen bench/pyloadgen.py --floor-cmd none --bare aiohttp
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import ssl
import threading
import time
from urllib.parse import urlsplit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-url", default="https://127.0.0.1:9443/mutate")
    parser.add_argument("-ca", default="ca.crt")
    parser.add_argument("-body", default="review.json")
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("-c", type=int, default=8)
    parser.add_argument("-warmup", type=int, default=500)
    args = parser.parse_args()
    url = urlsplit(args.url)
    context = ssl.create_default_context(cafile=args.ca)
    with open(args.body, "rb") as handle:
        template = json.load(handle)
    uids = itertools.count(1)

    def run(total: int) -> tuple[list[float], int, float]:
        latencies: list[float] = []
        errors = [0]
        left = iter(range(total))
        lock = threading.Lock()

        def worker() -> None:
            conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=context, timeout=10)
            while True:
                with lock:
                    if next(left, None) is None:
                        break
                    uid = next(uids)
                body = json.dumps(
                    {**template, "request": {**template["request"], "uid": f"u-{uid}"}}
                ).encode()
                started = time.perf_counter()
                try:
                    conn.request("POST", url.path, body, {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    response.read()
                    ok = response.status == 200
                except OSError:
                    conn.close()
                    ok = False
                with lock:
                    if ok:
                        latencies.append(time.perf_counter() - started)
                    else:
                        errors[0] += 1
            conn.close()

        threads = [threading.Thread(target=worker) for _ in range(args.c)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return latencies, errors[0], time.perf_counter() - start

    run(args.warmup)
    print(json.dumps(summary(*run(args.n))))


def summary(latencies: list[float], errors: int, elapsed: float) -> dict[str, float]:
    """The Go load generator's JSON line."""
    latencies.sort()

    def quantile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "errors": errors,
    }


if __name__ == "__main__":
    main()
