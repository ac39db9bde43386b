"""A closed-loop HTTP load generator: `concurrency` keep-alive clients each send GETs from a list
of paths back to back for `duration` seconds; prints one JSON line with the rate, the latency
percentiles and the failures.

Run as its own process (`python loadgen.py BASE_URL --paths-file F ...`) so that its CPU time is
not the server's; it uses the standard library and httpx only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx


async def client_loop(client: httpx.AsyncClient, paths: list[str], offset: int, stop_at: float,
                      latencies: list[float], failures: list[str]) -> None:
    i = offset
    while time.perf_counter() < stop_at:
        path = paths[i % len(paths)]
        i += 1
        start = time.perf_counter()
        try:
            response = await client.get(path)
            if response.status_code != 200:
                failures.append(f"{response.status_code} {path}")
        except httpx.HTTPError as e:
            failures.append(f"{type(e).__name__} {path}")
        latencies.append(time.perf_counter() - start)


async def run(base_url: str, paths: list[str], duration: float, concurrency: int) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=10) as client:
        for path in paths[:concurrency]:  # open the connections before the clock starts
            await client.get(path)
        start = time.perf_counter()
        stop_at = start + duration
        await asyncio.gather(*(
            client_loop(client, paths, k * 7, stop_at, latencies, failures)
            for k in range(concurrency)
        ))
        elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    pct = lambda q: 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "rate_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(pct(0.50), 3),
        "p90_ms": round(pct(0.90), 3),
        "p99_ms": round(pct(0.99), 3),
        "max_ms": round(1e3 * ordered[-1], 3),
        "mean_ms": round(1e3 * statistics.fmean(latencies), 3),
        "concurrency": concurrency,
        "errors": len(failures),
        "first_errors": failures[:10],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("--paths-file", required=True, help="one request path per line")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with open(args.paths_file) as f:
        paths = [line.strip() for line in f if line.strip()]
    result = asyncio.run(run(args.base_url, paths, args.duration, args.concurrency))
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
