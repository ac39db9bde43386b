"""Fixtures for the runtime: a clean resolution state per test, tables for a chosen device, and
real services on loopback (uvicorn) serving them."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kerneltune import env, runtime
from kerneltune.kernels import KernelConfig, KernelSpec
from kerneltune.runtime import resolve, sources, transfer
from kerneltune.runtime.resolve import spec_of
from kerneltune.table import Entry, Table, dumps

#: The device name the tests run "on" (env.device_name is patched), so a table for this GPU
#: can be tested on a CPU.
GPU = "NVIDIA Test GPU 80GB"
#: Where the tests' tensors live: the GPU where there is one, else the CPU (the interpreter).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OTHER_GPU = "NVIDIA Other GPU"


@pytest.fixture(autouse=True)
def clean_runtime(monkeypatch, tmp_path) -> Iterator[None]:
    """No KERNELTUNE_* from the outside, a private cache dir, nothing resolved yet, this GPU."""
    for name in (sources.ENV_TABLE, sources.ENV_URL):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(sources.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(env, "device_name", lambda index=None: GPU)
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(sources, "shipped_table_path", lambda device: shipped / f"{device}.json")
    monkeypatch.setattr(transfer, "shipped_tables_dir", lambda: shipped)  # other GPUs' tables
    runtime.reset()
    yield
    runtime.reset()


@pytest.fixture
def shipped_dir(tmp_path) -> Path:
    path = tmp_path / "shipped"
    path.mkdir(exist_ok=True)
    return path


def write_shipped(shipped_dir: Path, table: Table) -> Path:
    path = shipped_dir / f"{table.device}.json"
    path.write_text(dumps(table))
    return path


def tuned_config(spec: KernelSpec, m: int, n: int, dtype: str, skip: int = 0, **options
                 ) -> KernelConfig:
    """A valid config other than the default (the `skip`-th such), so its source shows."""
    problem = spec.problem(m, n, dtype, **options)
    default = spec.default(problem)
    found = [c for c in spec.configs(problem) if c != default]
    return found[skip % len(found)]


def entry(kernel: str, n: int, m: int, dtype: str = "float32", *, config: dict | None = None,
          kernel_hash: str | None = None, skip: int = 0) -> Entry:
    spec = spec_of(kernel)
    return Entry(
        kernel=kernel, dtype=dtype, n=n, m=m,
        config=config or tuned_config(spec, m, n, dtype, skip).to_json(),
        us=10.0, gbps=100.0, default_us=12.0, trials=5,
        kernel_hash=spec.kernel_hash if kernel_hash is None else kernel_hash,
    )


def table(*entries: Entry, device: str = GPU) -> Table:
    return Table(device=device, entries=list(entries))


def kt_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, runtime.KerneltuneWarning)]


# ------------------------------------------------------------------------------- services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """What the small table service answers, and what it was asked."""

    url: str = ""
    mode: str = "ok"  # ok | 500 | garbage | slow
    body: bytes = b""
    etag: str = '"v1"'
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def serve(self, t: Table, etag: str = '"v1"') -> None:
        self.body, self.etag, self.mode = dumps(t).encode(), etag, "ok"


def table_app(state: Served) -> Starlette:
    """A minimal table service: the real API's route and ETag protocol, with failure modes."""

    async def tables(request: Request) -> Response:
        inm = request.headers.get("if-none-match")
        state.requests.append((request.path_params["gpu"], inm))
        if state.mode == "500":
            return Response("internal error", status_code=500)
        if state.mode == "garbage":
            return Response(b'{"schema": 1, "device": ', media_type="application/json")
        if state.mode == "slow":
            await asyncio.sleep(3)
        if inm == state.etag:
            return Response(status_code=304, headers={"ETag": state.etag})
        return Response(state.body, media_type="application/json", headers={"ETag": state.etag})

    return Starlette(routes=[Route("/api/v1/tables/{gpu}", tables)])


class UvicornThread:
    """A real uvicorn server on a loopback port, in a background thread."""

    def __init__(self, app) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="auto", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def _table_server() -> Iterator[tuple[Served, UvicornThread]]:
    state = Served()
    with UvicornThread(table_app(state)) as server:
        state.url = server.url
        yield state, server


@pytest.fixture
def served(_table_server) -> Served:
    """The table service with a fresh script: serves nothing until told, records requests."""
    state, _ = _table_server
    state.mode, state.body, state.etag, state.requests = "ok", b"", '"v1"', []
    return state


@pytest.fixture
def refused_url() -> str:
    """A loopback URL nobody listens on."""
    return f"http://127.0.0.1:{free_port()}"


def resolution(kernel: str, m: int, n: int, dtype: str = "float32", **options):
    return runtime.explain(kernel, (m, n, dtype), **options)


__all__ = ["GPU", "OTHER_GPU", "resolve"]
