"""A closed-loop HTTP load generator; prints one JSON line with what it measured.

- `get` (the default): `concurrency` keep-alive clients each send GETs from a list of paths
  back to back for `duration` seconds (extra headers with `--header`): the rate, the latency
  percentiles and the failures.
- `writers`: one keep-alive client per list of bodies (`--bodies-file`: a JSON list of lists of
  `POST /api/v1/results` bodies), each posting its bodies one after the other, all at once: the
  answers by status, posts/s and the latency percentiles.
- `big-post`: one POST of `--size` bytes to `/api/v1/results`, with or without `--token`,
  streamed while its answer is awaited (as a client that reads early does), while another
  connection asks `/healthz` every 20 ms: the answer, how long it took and how much of the body
  had been sent by then, and `/healthz`'s latency meanwhile.

Run as its own process (`python loadgen.py BASE_URL --paths-file F ...`) so that its CPU time is
not the server's. The client is a minimal HTTP/1.1 keep-alive client on asyncio streams: a
general client (httpx) spends about 3 ms of CPU per request here, more than the server, so it
would measure itself. It speaks just what the service answers: a status line, headers with a
Content-Length, a body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

CHUNK = 64 * 1024


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int, headers: tuple[str, ...] = ()) -> None:
        self.host, self.port = host, port
        self.headers = "".join(f"{h}\r\n" for h in headers)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def get(self, path: str) -> int:
        return (await self.request("GET", path))[0]

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: tuple[str, ...] = ()) -> tuple[int, bytes]:
        await self.open()
        extra = "".join(f"{h}\r\n" for h in headers)
        length = f"Content-Length: {len(body)}\r\n" if method != "GET" else ""
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Accept: application/json\r\n{self.headers}{extra}{length}\r\n".encode() + body
        )
        return await self.response()

    async def response(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
            self.writer = None


def _address(base_url: str) -> tuple[str, int]:
    url = urlsplit(base_url)
    return url.hostname or "127.0.0.1", url.port or 80


def percentiles(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    if not ordered:
        return {}
    pct = lambda q: 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50_ms": round(pct(0.50), 3),
        "p90_ms": round(pct(0.90), 3),
        "p99_ms": round(pct(0.99), 3),
        "max_ms": round(1e3 * ordered[-1], 3),
        "mean_ms": round(1e3 * statistics.fmean(latencies), 3),
    }


# --------------------------------------------------------------------------- get


async def client_loop(connection: Connection, paths: list[str], offset: int, stop_at: float,
                      latencies: list[float], failures: list[str], expect: int) -> None:
    i = offset
    while time.perf_counter() < stop_at:
        path = paths[i % len(paths)]
        i += 1
        start = time.perf_counter()
        try:
            status = await asyncio.wait_for(connection.get(path), timeout=10)
            if status != expect:
                failures.append(f"{status} {path}")
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
            failures.append(f"{type(e).__name__} {path}")
            await connection.close()
        latencies.append(time.perf_counter() - start)


async def run(base_url: str, paths: list[str], duration: float, concurrency: int,
              headers: tuple[str, ...] = (), expect: int = 200) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    host, port = _address(base_url)
    connections = [Connection(host, port, headers) for _ in range(concurrency)]
    for connection in connections:  # connect before the clock starts
        await connection.get(paths[0])
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(*(
        client_loop(c, paths, k * 7, stop_at, latencies, failures, expect)
        for k, c in enumerate(connections)
    ))
    elapsed = time.perf_counter() - start
    for connection in connections:
        await connection.close()
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 3),
        "rate_per_s": round(len(latencies) / elapsed, 1),
        **percentiles(latencies),
        "concurrency": concurrency,
        "errors": len(failures),
        "first_errors": failures[:10],
    }


# --------------------------------------------------------------------------- writers


async def writers(base_url: str, bodies: list[list[str]], token: str) -> dict:
    """Each list of bodies posted in order by its own client, all clients at once."""
    host, port = _address(base_url)
    auth = (f"Authorization: Bearer {token}", "Content-Type: application/json")
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    failures: list[str] = []

    async def client(mine: list[str]) -> None:
        connection = Connection(host, port)
        await connection.open()
        await ready.wait()
        for body in mine:
            start = time.perf_counter()
            try:
                status, answer = await asyncio.wait_for(
                    connection.request("POST", "/api/v1/results", body.encode(), auth), 60)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
                statuses[0] += 1
                failures.append(type(e).__name__)
                await connection.close()
                continue
            latencies.append(time.perf_counter() - start)
            statuses[status] += 1
            if status != 200:
                failures.append(f"{status} {answer[:200].decode(errors='replace')}")
        await connection.close()

    ready = asyncio.Event()
    tasks = [asyncio.create_task(client(mine)) for mine in bodies]
    await asyncio.sleep(0.2)  # every client connected
    start = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    posts = sum(statuses.values())
    return {
        "clients": len(bodies),
        "posts": posts,
        "entries": sum(len(json.loads(b)["entries"]) for mine in bodies for b in mine),
        "seconds": round(elapsed, 3),
        "posts_per_s": round(posts / elapsed, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "errors": posts - statuses[200],
        "first_errors": failures[:10],
        **percentiles(latencies),
    }


# --------------------------------------------------------------------------- big-post


async def big_post(base_url: str, size: int, token: str | None = None, *,
                   chunked: bool = False, probe_path: str = "/healthz") -> dict:
    """One POST of `size` bytes, sent while its answer is awaited, with `/healthz` asked every
    20 ms on another connection until the answer came and the body was sent (or refused)."""
    host, port = _address(base_url)
    reader, writer = await asyncio.open_connection(host, port)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    start = time.perf_counter()
    writer.write(f"POST /api/v1/results HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
                 f"Content-Type: application/json\r\n{framing}\r\n\r\n".encode())
    sent = 0
    sent_at_answer: int | None = None
    send_error: str | None = None
    done = asyncio.Event()

    async def send_body() -> None:
        nonlocal sent, send_error
        chunk = b"[" + b" " * (CHUNK - 1)
        try:
            while sent < size:
                piece = chunk[: size - sent]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                await writer.drain()
                sent += len(piece)
                await asyncio.sleep(0)  # let the answer be read as soon as it comes
            if chunked:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except OSError as e:  # the server closed the connection: no more is read
            send_error = type(e).__name__

    async def probe(latencies: list[float]) -> None:
        connection = Connection(host, port)
        while not done.is_set():
            t = time.perf_counter()
            await connection.get(probe_path)
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
        await connection.close()

    health: list[float] = []
    prober = asyncio.create_task(probe(health))
    sender = asyncio.create_task(send_body())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
        answered = time.perf_counter() - start
        sent_at_answer = sent
        status = int(head[9:12])
        length = next((int(line.partition(b":")[2]) for line in head.split(b"\r\n")[1:]
                       if line.lower().startswith(b"content-length:")), 0)
        answer = (await reader.readexactly(length)).decode(errors="replace")
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as e:
        answered, status, answer = time.perf_counter() - start, 0, type(e).__name__
    await sender
    uploaded = time.perf_counter() - start
    done.set()
    await prober
    writer.close()
    return {
        "bytes": size,
        "token": bool(token),
        "chunked": chunked,
        "status": status,
        "answer": answer[:200],
        "answered_s": round(answered, 4),
        "sent_bytes_at_answer": sent_at_answer,
        "upload_s": round(uploaded, 4),
        "send_error": send_error,
        "healthz_during": {"requests": len(health), **percentiles(health)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("--mode", choices=("get", "writers", "big-post"), default="get")
    parser.add_argument("--paths-file", help="get: one request path per line")
    parser.add_argument("--header", action="append", default=[], help="get: an extra header")
    parser.add_argument("--expect", type=int, default=200, help="get: the status expected")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--bodies-file", help="writers: a JSON list of lists of bodies")
    parser.add_argument("--token", help="writers, big-post: the bearer token")
    parser.add_argument("--size", type=int, default=40_000_000, help="big-post: body bytes")
    parser.add_argument("--chunked", action="store_true", help="big-post: no Content-Length")
    args = parser.parse_args()
    if args.mode == "get":
        with open(args.paths_file) as f:
            paths = [line.strip() for line in f if line.strip()]
        result = asyncio.run(run(args.base_url, paths, args.duration, args.concurrency,
                                 tuple(args.header), args.expect))
    elif args.mode == "writers":
        with open(args.bodies_file) as f:
            bodies = json.load(f)
        result = asyncio.run(writers(args.base_url, bodies, args.token))
    else:
        result = asyncio.run(big_post(args.base_url, args.size, args.token,
                                      chunked=args.chunked))
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
