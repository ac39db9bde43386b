"""A closed-loop HTTP load generator: `concurrency` keep-alive clients each send GETs from a list
of paths back to back for `duration` seconds; prints one JSON line with the rate, the latency
percentiles and the failures.

Run as its own process (`python loadgen.py BASE_URL --paths-file F ...`) so that its CPU time is
not the server's. The client is a minimal HTTP/1.1 keep-alive client on asyncio streams: a
general client (httpx) spends about 3 ms of CPU per request here, more than the server, so it
would measure itself. It speaks just what the service answers: a status line, headers with a
Content-Length, a body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from urllib.parse import urlsplit


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Accept: application/json\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def client_loop(connection: Connection, paths: list[str], offset: int, stop_at: float,
                      latencies: list[float], failures: list[str]) -> None:
    i = offset
    while time.perf_counter() < stop_at:
        path = paths[i % len(paths)]
        i += 1
        start = time.perf_counter()
        try:
            status = await asyncio.wait_for(connection.get(path), timeout=10)
            if status != 200:
                failures.append(f"{status} {path}")
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
            failures.append(f"{type(e).__name__} {path}")
            await connection.close()
            connection.writer = None
        latencies.append(time.perf_counter() - start)


async def run(base_url: str, paths: list[str], duration: float, concurrency: int) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    url = urlsplit(base_url)
    connections = [Connection(url.hostname or "127.0.0.1", url.port or 80)
                   for _ in range(concurrency)]
    for connection in connections:  # connect before the clock starts
        await connection.get(paths[0])
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(*(
        client_loop(c, paths, k * 7, stop_at, latencies, failures)
        for k, c in enumerate(connections)
    ))
    elapsed = time.perf_counter() - start
    for connection in connections:
        await connection.close()
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
