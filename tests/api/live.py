"""A real service on loopback: `python -m kerneltune.api.cli` (what `kerneltune serve` runs) in a
subprocess, over an SQLite file seeded with a known table."""

from __future__ import annotations

import functools
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from kerneltune.kernels import REGISTRY
from kerneltune.storage import import_table, make_engine, migrate, session_factory
from kerneltune.table import Entry, Env, Table

#: Names no shipped table uses: the store must hold exactly what the tests seed.
GPU = "NVIDIA TEST-A 80GB HBM3"
OTHER_GPU = "NVIDIA TEST-B"
KERNEL = "rmsnorm_fwd"
TOKEN = "test-write-token-0123456789"
COPY_GBPS = 3000.0
SEEDED_N = (1024, 2048, 4096, 8192)
SEEDED_M = (1, 64, 4096)
#: A tuned shape whose only entry was measured on other kernel source.
STALE_N, STALE_M = 3072, 128
STALE_HASH = "0" * 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tuned_config(n: int, m: int) -> dict:
    """A valid config other than the heuristic one, so an answer's source is visible."""
    return dict(_tuned_config(n, m))


@functools.cache
def _tuned_config(n: int, m: int) -> dict:
    spec = REGISTRY[KERNEL]
    problem = spec.problem(m, n, "bfloat16")
    default = spec.default(problem)
    return next(c for c in spec.configs(problem) if c != default).to_json()


def seeded_entry(n: int, m: int, *, us: float | None = None, kernel_hash: str | None = None,
                 dtype: str = "bfloat16") -> Entry:
    spec = REGISTRY[KERNEL]
    us = us if us is not None else 2.0 + n * m / 1e6
    gbps = spec.bytes_moved(spec.problem(m, n, dtype)) / (us * 1e3)
    return Entry(
        kernel=KERNEL, dtype=dtype, n=n, m=m, config=tuned_config(n, m), us=us, gbps=gbps,
        default_us=us * 1.25, trials=20, kernel_hash=kernel_hash or spec.kernel_hash,
        frac_copy=gbps / COPY_GBPS,
    )


def seeded_table() -> Table:
    entries = [seeded_entry(n, m) for n in SEEDED_N for m in SEEDED_M]
    entries.append(seeded_entry(STALE_N, STALE_M, kernel_hash=STALE_HASH))
    env = Env(triton="3.6.0", torch="2.11.0", cuda="13.0", driver="580.1", python="3.12")
    return Table(device=GPU, env=env, copy_gbps=COPY_GBPS, entries=entries)


def seed_database(url: str) -> None:
    engine = make_engine(url)
    try:
        migrate(engine)
        with session_factory(engine).begin() as session:
            import_table(session, seeded_table())
            import_table(session, Table(device=OTHER_GPU, entries=[seeded_entry(4096, 64)]))
    finally:
        engine.dispose()


@dataclass
class Server:
    url: str
    database_url: str
    process: subprocess.Popen
    log: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


def spawn_server(tmp: Path, database_url: str, *, token: str | None = TOKEN,
                 command: tuple[str, ...] = ("kerneltune.api.cli",),
                 extra_env: dict[str, str] | None = None,
                 log_level: str | None = "warning") -> Server:
    """Start the service on a free loopback port: by default through `kerneltune serve`'s
    function (migrate, load shipped tables, uvicorn), or any `python -m` command given."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELTUNE_")}
    env["KERNELTUNE_DATABASE_URL"] = database_url
    env["XDG_DATA_HOME"] = str(tmp / "data")  # never touch the user's default store
    if token is not None:
        env["KERNELTUNE_WRITE_TOKEN"] = token
    env.update(extra_env or {})
    log = tmp / f"server-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", *command, "--host", "127.0.0.1", "--port", str(port),
         *(["--log-level", log_level] if log_level else [])],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp,
    )
    return Server(f"http://127.0.0.1:{port}", database_url, process, log)


def wait_healthy(server: Server, timeout_s: float = 120) -> Server:
    deadline = time.monotonic() + timeout_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.process.returncode}:\n{server.log.read_text()}"
            )
        try:
            if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"server did not answer /healthz:\n{server.log.read_text()}")
        time.sleep(0.2)


def start_server(tmp: Path, database_url: str, **kwargs) -> Server:
    return wait_healthy(spawn_server(tmp, database_url, **kwargs))


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def wait_for_workers(log: Path, workers: int, timeout_s: float = 180) -> None:
    """Until every worker process has started (each imports torch: seconds of CPU that would
    otherwise be taken from the measurement)."""
    deadline = time.monotonic() + timeout_s
    while log.read_text().count("Application startup complete") < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers did not start:\n{log.read_text()}")
        time.sleep(0.2)


def entry_json(entry: Entry) -> dict:
    return {k: v for k, v in asdict(entry).items() if v is not None}


#: The keys concurrent writers share: every POST writes 2-4 of them, in a random order.
WRITER_KEYS = tuple((n, m) for n in (1024, 2048, 4096, 8192) for m in (64, 128))


def writer_bodies(device: str, clients: int, posts: int, seed: int = 0
                  ) -> tuple[list[list[str]], list[tuple[int, int, float]]]:
    """`posts` POST bodies for each of `clients` writers of `device`, each with 2-4 of
    `WRITER_KEYS` in a random order and random times; and every (n, m, us) they carry."""
    rng = random.Random(seed)
    bodies: list[list[str]] = []
    sent: list[tuple[int, int, float]] = []
    for _ in range(clients):
        mine = []
        for _ in range(posts):
            keys = rng.sample(WRITER_KEYS, rng.randint(2, 4))
            entries = [seeded_entry(n, m, us=round(rng.uniform(1.0, 100.0), 4))
                       for n, m in keys]
            sent.extend((e.n, e.m, e.us) for e in entries)
            mine.append(json.dumps({"device": device,
                                    "entries": [entry_json(e) for e in entries]}))
        bodies.append(mine)
    return bodies, sent


def fastest(sent: list[tuple[int, int, float]]) -> dict[tuple[int, int], float]:
    best: dict[tuple[int, int], float] = {}
    for n, m, us in sent:
        best[(n, m)] = min(us, best.get((n, m), us))
    return best


LOADGEN = Path(__file__).with_name("loadgen.py")


def loadgen(base_url: str, *args: str, timeout_s: float = 300) -> dict:
    """Run the load generator as its own process (its CPU is not the server's)."""
    run = subprocess.run([sys.executable, str(LOADGEN), base_url, *args], capture_output=True,
                         text=True, timeout=timeout_s, check=True)
    return json.loads(run.stdout)
