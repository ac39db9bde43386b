"""Every endpoint of the service, through a real uvicorn process on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict
from urllib.parse import quote

import httpx
import pytest

from kerneltune.kernels import REGISTRY
from kerneltune.storage import export_table, make_engine, session_factory
from kerneltune.table import device_slug, dumps, loads, m_bucket

from .live import (
    COPY_GBPS,
    GPU,
    KERNEL,
    OTHER_GPU,
    SEEDED_M,
    SEEDED_N,
    STALE_M,
    STALE_N,
    TOKEN,
    Server,
    seeded_entry,
    spawn_server,
    stop_server,
    tuned_config,
    wait_healthy,
)

SPEC = REGISTRY[KERNEL]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def config_of(client: httpx.Client, **params) -> httpx.Response:
    return client.get(f"/api/v1/configs/{params.pop('kernel', KERNEL)}", params=params)


def entry_json(entry) -> dict:
    return {k: v for k, v in asdict(entry).items() if v is not None}


# --------------------------------------------------------------------------- health


def test_healthz_and_readyz(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_openapi_and_docs(client):
    schema = client.get("/openapi.json").json()
    for path in ("/api/v1/configs/{kernel}", "/api/v1/tables/{gpu}", "/api/v1/gpus",
                 "/api/v1/kernels", "/api/v1/results", "/healthz", "/readyz"):
        assert path in schema["paths"]
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_need_no_network(client, page):
    """Swagger UI and ReDoc come from the service itself: every script, style sheet and icon
    the page names is a path here, and is served."""
    html = client.get(page).text
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?["']([^"']+)["']""", html)
    urls = [a or b for a, b in assets]
    assert any(u.endswith(".js") for u in urls), html
    for url in urls:
        assert url.startswith("/"), url  # nothing from a CDN
        assert client.get(url).status_code == 200, url


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("gpu", [GPU, device_slug(GPU)])
def test_config_exact(client, gpu):
    answer = config_of(client, gpu=gpu, n=4096, m=64, dtype="bfloat16").json()
    seeded = seeded_entry(4096, 64)
    assert answer["match"] == "exact"
    assert answer["gpu"] == GPU
    assert answer["key"] == {"n": 4096, "m": 64, "dtype": "bfloat16"}
    assert answer["config"] == dict(tuned_config(4096, 64))
    assert answer["config"] != dict(SPEC.default(SPEC.problem(64, 4096)))
    measured = answer["measurement"]
    assert measured["us"] == pytest.approx(seeded.us)
    assert measured["gbps"] == pytest.approx(seeded.gbps)
    assert measured["frac_copy"] == pytest.approx(seeded.gbps / COPY_GBPS)
    assert measured["speedup"] == pytest.approx(1.25)
    assert measured["kernel_hash"] == answer["kernel_hash"] == SPEC.kernel_hash
    assert measured["stale"] is False


@pytest.mark.parametrize("m", [33, 50, 64])
def test_config_rounds_m_up_to_its_bucket(client, m):
    answer = config_of(client, gpu=GPU, n=2048, m=m).json()  # dtype defaults to bfloat16
    assert (answer["m"], answer["m_bucket"], answer["match"]) == (m, 64, "exact")
    assert answer["key"] == {"n": 2048, "m": 64, "dtype": "bfloat16"}


def test_config_nearest_shape(client):
    answer = config_of(client, gpu=GPU, n=5000, m=60).json()
    assert answer["match"] == "nearest"
    assert answer["key"] == {"n": 4096, "m": 64, "dtype": "bfloat16"}  # nearest N, then M
    assert answer["config"] == dict(tuned_config(4096, 64))
    assert answer["measurement"]["us"] == pytest.approx(seeded_entry(4096, 64).us)


def test_config_skips_stale_entry(client):
    answer = config_of(client, gpu=GPU, n=STALE_N, m=STALE_M).json()
    # Another GPU's entry at this key (the shipped tables are in the store) or a nearer shape.
    assert answer["match"] in ("transfer", "nearest")
    assert answer["match"] == "nearest" or answer["transfer_from"] not in (None, GPU)
    assert answer["measurement"]["stale"] is False
    assert answer["measurement"]["kernel_hash"] == SPEC.kernel_hash


def test_config_of_the_other_16_bit_dtype(client):
    answer = config_of(client, gpu=GPU, n=4096, m=64, dtype="float16").json()
    assert (answer["dtype"], answer["match"]) == ("float16", "nearest")
    assert answer["key"] == {"n": 4096, "m": 64, "dtype": "bfloat16"}  # the same bytes moved
    assert answer["config"] == dict(tuned_config(4096, 64))
    assert answer["measurement"]["us"] == pytest.approx(seeded_entry(4096, 64).us)


def test_config_default_without_tuned_dtype(client):
    answer = config_of(client, gpu=GPU, n=4096, m=64, dtype="float32").json()
    assert answer["match"] == "default"
    assert answer["key"] is None and answer["measurement"] is None
    assert answer["config"] == dict(SPEC.default(SPEC.problem(64, 4096, "float32")))


def test_config_default_when_nearest_config_cannot_run(client):
    # The only tuned shape of OTHER_GPU loops over 16-wide chunks: useless for N = 8.
    answer = config_of(client, gpu=OTHER_GPU, n=8, m=64).json()
    with pytest.raises(ValueError):
        SPEC.parse(SPEC.problem(64, 8), dict(tuned_config(4096, 64)))
    assert answer["match"] == "default"
    assert answer["config"] == dict(SPEC.default(SPEC.problem(64, 8)))


def test_config_unknown_kernel_is_404(client):
    r = config_of(client, kernel="no_such_kernel", gpu=GPU, n=4096, m=64)
    assert r.status_code == 404
    assert "no_such_kernel" in r.json()["detail"] and KERNEL in r.json()["detail"]


def test_config_unknown_gpu_is_404_naming_known_ones(client):
    r = config_of(client, gpu="Voodoo 3", n=4096, m=64)
    assert r.status_code == 404
    assert GPU in r.json()["detail"] and OTHER_GPU in r.json()["detail"]


@pytest.mark.parametrize(
    "params",
    [
        {"gpu": GPU, "n": 4096, "m": 64, "dtype": "float64"},
        {"gpu": GPU, "n": -1, "m": 64},
        {"gpu": GPU, "n": 0, "m": 64},
        {"gpu": GPU, "n": (1 << 22) + 1, "m": 64},
        {"gpu": GPU, "n": 4096, "m": 1 << 40},
        {"gpu": GPU, "n": 4096, "m": 0},
        {"gpu": GPU, "n": "many", "m": 64},
        {"gpu": GPU, "n": 4096},
        {"gpu": "x" * 1000, "n": 4096, "m": 64},
        {"gpu": "", "n": 4096, "m": 64},
        {"kernel": "k" * 100, "gpu": GPU, "n": 4096, "m": 64},
    ],
)
def test_config_malformed_query_is_422(client, params):
    assert config_of(client, **params).status_code == 422


# --------------------------------------------------------------------------- tables


def stored_table_text(server: Server, device: str) -> str:
    engine = make_engine(server.database_url)
    try:
        with session_factory(engine)() as session:
            return dumps(export_table(session, device))
    finally:
        engine.dispose()


@pytest.mark.parametrize("gpu", [GPU, device_slug(GPU)])
def test_table_is_the_exported_table(server, client, gpu):
    r = client.get(f"/api/v1/tables/{quote(gpu)}")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.text == stored_table_text(server, GPU)
    table = loads(r.content)
    assert table.device == GPU and table.copy_gbps == COPY_GBPS
    assert {(e.n, e.m) for e in table.entries} >= {(n, m) for n in SEEDED_N for m in SEEDED_M}
    assert r.headers["etag"].startswith('"') and r.headers["etag"].endswith('"')
    assert "max-age" in r.headers["cache-control"]


def test_table_not_modified(client):
    etag = client.get(f"/api/v1/tables/{quote(GPU)}").headers["etag"]
    for given in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        r = client.get(f"/api/v1/tables/{quote(GPU)}", headers={"If-None-Match": given})
        assert r.status_code == 304, given
        assert r.content == b"" and r.headers["etag"] == etag
    r = client.get(f"/api/v1/tables/{quote(GPU)}", headers={"If-None-Match": '"stale-tag"'})
    assert r.status_code == 200 and r.headers["etag"] == etag


def test_table_unknown_gpu_is_404(client):
    assert client.get("/api/v1/tables/nvidia-voodoo-3").status_code == 404
    assert client.get(f"/api/v1/tables/{'x' * 300}").status_code == 422


# --------------------------------------------------------------------------- meta


def test_gpus(client):
    gpus = {g["name"]: g for g in client.get("/api/v1/gpus").json()}
    assert gpus[GPU] == {
        "name": GPU, "slug": device_slug(GPU), "copy_gbps": COPY_GBPS,
        "entries": len(SEEDED_N) * len(SEEDED_M) + 1, "kernels": [KERNEL],
    }
    assert gpus[OTHER_GPU]["entries"] == 1 and gpus[OTHER_GPU]["copy_gbps"] is None


def test_kernels(client):
    kernels = {k["name"]: k for k in client.get("/api/v1/kernels").json()}
    assert set(kernels) == set(REGISTRY)
    for name, spec in REGISTRY.items():
        example = spec.problem(4096, 4096)
        info = kernels[name]
        assert info["kernel_hash"] == spec.kernel_hash
        assert info["parameters"] == json.loads(json.dumps(spec.space(example)))
        assert info["options"] == {k: list(v) for k, v in spec.options.items()}
        assert info["default"] == spec.default(example).to_json()
        assert info["description"]


# --------------------------------------------------------------------------- results


def test_post_needs_the_token(client):
    body = {"device": "Auth GPU", "entries": [entry_json(seeded_entry(4096, 64))]}
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):
        r = client.post("/api/v1/results", json=body, headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
    gpus = [g["name"] for g in client.get("/api/v1/gpus").json()]
    assert "Auth GPU" not in gpus


def test_post_keeps_the_faster_and_etag_follows_the_table(client):
    device = "ETag Test GPU"
    url = f"/api/v1/tables/{quote(device)}"
    first = seeded_entry(4096, 64, us=10.0)
    r = client.post("/api/v1/results", json={"device": device, "entries": [entry_json(first)]},
                    headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"device": device, "kept": [],
                        "stored": [{"kernel": KERNEL, "dtype": "bfloat16", "n": 4096, "m": 64}]}
    etag = client.get(url).headers["etag"]

    slower = seeded_entry(4096, 64, us=12.0)
    r = client.post("/api/v1/results", json={"device": device, "entries": [entry_json(slower)]},
                    headers=AUTH)
    assert r.json()["stored"] == [] and len(r.json()["kept"]) == 1
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304

    faster = seeded_entry(4096, 64, us=8.0)
    r = client.post("/api/v1/results", json={"device": device, "entries": [entry_json(faster)]},
                    headers=AUTH)
    assert len(r.json()["stored"]) == 1
    r = client.get(url, headers={"If-None-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] != etag
    assert [e.us for e in loads(r.content).entries] == [8.0]
    answer = config_of(client, gpu=device, n=4096, m=64).json()
    assert answer["match"] == "exact" and answer["measurement"]["us"] == 8.0


def test_post_of_other_kernel_code_never_replaces_a_result_the_service_serves(client):
    device = "Code Version GPU"
    current = seeded_entry(4096, 64, us=10.0)
    r = client.post("/api/v1/results", json={"device": device, "entries": [entry_json(current)]},
                    headers=AUTH)
    assert len(r.json()["stored"]) == 1
    # A worker on older kernel code publishes the same key, faster: the service keeps its own.
    older = seeded_entry(4096, 64, us=5.0, kernel_hash="0123456789abcdef")
    r = client.post("/api/v1/results", json={"device": device, "entries": [entry_json(older)]},
                    headers=AUTH)
    assert r.json()["stored"] == [] and len(r.json()["kept"]) == 1
    answer = config_of(client, gpu=device, n=4096, m=64).json()
    assert answer["match"] == "exact" and answer["measurement"]["us"] == 10.0


def test_post_a_whole_table_document(client):
    device = "Document GPU"
    entries = [seeded_entry(n, 64) for n in (1024, 2048)]
    doc = {"schema": 1, "device": device, "copy_gbps": 4220.0,
           "env": {"triton": "3.6.0", "torch": "2.11.0"},
           "entries": [entry_json(e) | {"speedup": e.speedup} for e in entries]}
    r = client.post("/api/v1/results", json=doc, headers=AUTH)
    assert r.status_code == 200 and len(r.json()["stored"]) == 2
    gpu = next(g for g in client.get("/api/v1/gpus").json() if g["name"] == device)
    assert gpu["copy_gbps"] == 4220.0 and gpu["entries"] == 2
    table = loads(client.get(f"/api/v1/tables/{quote(device)}").content)
    assert all(e.env is not None and e.env.triton == "3.6.0" for e in table.entries)


def _post_one(client, **changes) -> httpx.Response:
    entry = entry_json(seeded_entry(4096, 64)) | changes
    return client.post("/api/v1/results", json={"device": "Bad GPU", "entries": [entry]},
                       headers=AUTH)


@pytest.mark.parametrize(
    "changes",
    [
        {"m": 48},  # not a power-of-two bucket
        {"kernel": "no_such_kernel"},
        {"dtype": "float64"},
        {"us": -1.0},
        {"us": 0},
        {"n": 0},
        {"config": {}},
        {"config": {"BLOCK_N": [1, 2]}},
        {"kernel_hash": "h" * 1000},
        {"trials": -3},
    ],
)
def test_post_malformed_entry_is_422(client, changes):
    assert _post_one(client, **changes).status_code == 422


def test_post_malformed_bodies_are_422(client):
    post = lambda body: client.post("/api/v1/results", json=body, headers=AUTH)  # noqa: E731
    entry = entry_json(seeded_entry(4096, 64))
    assert post({"device": "Dup GPU", "entries": [entry, entry]}).status_code == 422
    assert post({"device": "x" * 1000, "entries": [entry]}).status_code == 422
    assert post({"device": "\v", "entries": []}).status_code == 422  # blank: no name
    assert post({"entries": [entry]}).status_code == 422
    assert post({"schema": 2, "device": "v2 GPU", "entries": [entry]}).status_code == 422
    r = client.post("/api/v1/results", content=b"{not json", headers=AUTH)
    assert r.status_code == 422
    assert "Bad GPU" not in [g["name"] for g in client.get("/api/v1/gpus").json()]


# --------------------------------------------------------------------------- page


def test_page_and_its_static_files(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/app.js"' in page.text
    for path in ("/static/app.js", "/static/style.css"):
        r = client.get(path)
        assert r.status_code == 200
        # Everything the page loads is its own: no other host is named (but the SVG namespace).
        text = (page.text + r.text).replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text


# --------------------------------------------------------------------------- unavailable store


@pytest.fixture(scope="module")
def broken_servers(tmp_path_factory) -> Iterator[dict[str, Server]]:
    """Servers (plain uvicorn on the app factory, without a write token) over a PostgreSQL that
    nothing listens on and over an SQLite file that was never migrated."""
    tmp = tmp_path_factory.mktemp("broken")
    command = ("uvicorn", "kerneltune.api.app:create_app", "--factory")
    servers = {
        "unreachable": spawn_server(tmp, "postgresql+psycopg://postgres@127.0.0.1:1/none",
                                    token=None, command=command),
        "unmigrated": spawn_server(tmp, f"sqlite:///{tmp / 'empty.db'}", token=None,
                                   command=command),
    }
    try:
        for s in servers.values():
            wait_healthy(s)
        yield servers
    finally:
        for s in servers.values():
            stop_server(s)


@pytest.mark.parametrize("which, reason, retry_after", [("unreachable", "unreachable", "5"),
                                                        ("unmigrated", "not migrated", None)])
def test_readyz_503_without_a_usable_store(broken_servers, which, reason, retry_after):
    with broken_servers[which].client() as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503 and reason in r.json()["detail"]
        # Reads that need the store answer 503 too, never 500; Retry-After only where the
        # same request may succeed later (a store that is down may come back, an unmigrated
        # one stays so until someone migrates it).
        for path in ("/api/v1/gpus", f"/api/v1/configs/{KERNEL}?gpu=x&n=8&m=8",
                     "/api/v1/tables/x"):
            r = client.get(path)
            assert r.status_code == 503, path
            assert r.json()["detail"].startswith("database unavailable")
            assert r.headers.get("retry-after") == retry_after, path
        assert client.get("/api/v1/kernels").status_code == 200  # needs no store
        r = client.post("/api/v1/results", json={"device": "x", "entries": []}, headers=AUTH)
        assert r.status_code == 403 and "disabled" in r.json()["detail"]


def test_m_bucket_is_what_the_service_rounds_to(client):
    for m in (1, 3, 1000, (1 << 31) - 5):
        answer = config_of(client, gpu=GPU, n=4096, m=m).json()
        assert answer["m_bucket"] == m_bucket(m)
