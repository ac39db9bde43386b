"""`POST /api/v1/results` refuses, all or nothing, what it may not store: configs outside their
kernel's space, unknown kernels, bodies that are not strict JSON, empty posts; every refusal in
FastAPI's documented 422 shape. The app runs in process over a real SQLite file (and a real
PostgreSQL where one answers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from kerneltune.api.app import create_app
from kerneltune.api.settings import Settings
from kerneltune.kernels import REGISTRY
from kerneltune.storage import list_devices, make_engine, migrate, session_factory
from kerneltune.table import Entry

TOKEN = "checks-write-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = REGISTRY["rmsnorm_fwd"]
N, M = 4096, 64


def valid_entry(n: int = N, m: int = M, **changes: Any) -> dict[str, Any]:
    config = SPEC.default(SPEC.problem(m, n, "bfloat16")).to_json()
    entry = Entry(kernel=SPEC.name, dtype="bfloat16", n=n, m=m, config=config, us=10.0,
                  gbps=100.0, default_us=12.0, trials=5, kernel_hash=SPEC.kernel_hash)
    return {k: v for k, v in asdict(entry).items() if v is not None} | changes


def with_config(**changes: Any) -> dict[str, Any]:
    entry = valid_entry()
    return entry | {"config": entry["config"] | changes}


def open_store(url: str) -> Iterator[TestClient]:
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    with TestClient(create_app(Settings(database_url=url, write_token=TOKEN))) as client:
        yield client


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[TestClient]:
    yield from open_store(f"sqlite:///{tmp_path_factory.mktemp('checks') / 'kerneltune.db'}")


def post(client: TestClient, body: Any, **headers: str):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/api/v1/results", content=content,
                       headers={"Content-Type": "application/json", **AUTH, **headers})


def details(response) -> list[dict[str, Any]]:
    """The 422's errors, each in FastAPI's documented shape."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail
    for item in detail:
        assert isinstance(item["loc"], list) and isinstance(item["msg"], str)
        assert isinstance(item["type"], str)
        assert all(isinstance(part, str | int) for part in item["loc"])
    return detail


def stored(client: TestClient, device: str) -> bool:
    return client.get(f"/api/v1/tables/{quote(device, safe='')}").status_code == 200


# ------------------------------------------------------------------------------ configs


def test_refused_configs_are_named_by_entry_and_parameter_and_nothing_is_stored(client):
    device = "Refused Config GPU"
    body = {"device": device, "copy_gbps": 3000.0, "entries": [
        valid_entry(),
        with_config(ROWS=-1) | {"m": 128},  # launched as it was: uninitialized rows
        valid_entry(m=256) | {"config": {"BLOCK_N": 1024}},  # made every lookup answer 500
        with_config(num_warps=4.0) | {"m": 512},
        with_config(NOT_A_PARAMETER=1) | {"m": 1024},
    ]}
    detail = details(post(client, body))
    assert [d["loc"] for d in detail] == [
        ["body", "entries", 1, "config", "ROWS"],
        ["body", "entries", 2, "config", "EVICT"],
        ["body", "entries", 3, "config", "num_warps"],
        ["body", "entries", 4, "config", "NOT_A_PARAMETER"],
    ]
    assert detail[0]["msg"].startswith(f"entries[1] (rmsnorm_fwd bfloat16 n={N} m=128): ")
    assert "ROWS=-1 is not one of" in detail[0]["msg"]
    assert "missing parameters" in detail[1]["msg"]
    # All or nothing: not even the valid entry, nor the device's copy bandwidth.
    assert not stored(client, device)
    assert device not in [g["name"] for g in client.get("/api/v1/gpus").json()]
    # The valid entry alone is stored, and answers lookups.
    assert post(client, {"device": device, "entries": [valid_entry()]}).status_code == 200
    answer = client.get(f"/api/v1/configs/{SPEC.name}", params={"gpu": device, "n": N, "m": M})
    assert answer.status_code == 200 and answer.json()["match"] == "exact"


def test_a_config_outside_the_constraints_is_named_by_its_entry(client):
    # Each parameter is one of the space's, but a whole row of 4096 does not fit 1024 columns.
    detail = details(post(client, {"device": "Constraint GPU",
                                   "entries": [with_config(BLOCK_N=1024)]}))
    assert [d["loc"] for d in detail] == [["body", "entries", 0, "config"]]
    assert "does not fit" in detail[0]["msg"]
    assert not stored(client, "Constraint GPU")


def test_an_unknown_kernel_is_named_by_its_entry(client):
    detail = details(post(client, {"device": "Unknown Kernel GPU",
                                   "entries": [valid_entry(), valid_entry() | {"kernel": "k9"}]}))
    assert [d["loc"] for d in detail] == [["body", "entries", 1, "kernel"]]
    assert "unknown kernel 'k9'" in detail[0]["msg"] and "rmsnorm_fwd" in detail[0]["msg"]


def test_entries_of_other_kernel_code_are_checked_too(client):
    old = with_config(GRID_MULT=0) | {"kernel_hash": "0123456789abcdef"}
    detail = details(post(client, {"device": "Old Code GPU", "entries": [old]}))
    assert detail[0]["loc"] == ["body", "entries", 0, "config", "GRID_MULT"]


# ------------------------------------------------------------------------------ bodies


def _entry_text(**changes: Any) -> str:
    return json.dumps(valid_entry(**changes))


@pytest.mark.parametrize("body, loc", [
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"us": 10.0', '"us": NaN').encode(), ["body"]),
    (b'{"device": "B", "speedup": NaN, "entries": [%s]}' % _entry_text().encode(), ["body"]),
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"gbps": 100.0', '"gbps": Infinity').encode(), ["body"]),
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"us": 10.0', '"us": -Infinity').encode(), ["body"]),
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"us": 10.0', '"us": 1e999').encode(), ["body"]),
    (b'{"device": "B\\ud800", "entries": [%s]}' % _entry_text().encode(), ["body", "device"]),
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"bfloat16"', '"\\udfff"').encode(), ["body", "entries", 0, "dtype"]),
    (b'{"device": "B\xed\xa0\x80", "entries": []}', ["body", 13]),  # an encoded surrogate
    (b'{"device": "B\\u0000", "entries": [%s]}' % _entry_text().encode(), ["body", "device"]),
    (b'{"device": "B", "entries": [%s]}' % _entry_text().replace(
        '"kernel_hash": "', '"kernel_hash": "\\u0000').encode(),
     ["body", "entries", 0, "kernel_hash"]),
    (b'{"device": "B", "entries": [], "x": %s}' % (b"[" * 100_000 + b"]" * 100_000), ["body"]),
    (b'{"device": "B", "entries": [], "x": 1%s}' % (b"0" * 5000), ["body"]),
])
def test_a_body_that_is_not_strict_json_is_422_and_stores_nothing(client, body, loc):
    """NaN, Infinity or a lone surrogate made the answer itself fail (500, a reset
    connection); a NUL reached the store; a too deep or too long number was a 400."""
    detail = details(post(client, body))
    assert [d["loc"] for d in detail] == [loc]
    assert "\\ud800" not in json.dumps(detail)  # never echoed back
    assert not stored(client, "B")


def test_authentication_comes_before_the_body_checks(client):
    body = b'{"device": "B", "speedup": NaN, "entries": []}'
    r = client.post("/api/v1/results", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401


def test_an_empty_post_is_422_and_makes_no_device(client):
    device = "Empty Post GPU"
    detail = details(post(client, {"device": device, "copy_gbps": 100.0, "entries": []}))
    assert detail[0]["loc"] == ["body", "entries"] and detail[0]["type"] == "too_short"
    sessions = session_factory(client.app.state.engine)
    with sessions() as session:
        assert device not in [d.name for d in list_devices(session)]


def test_the_openapi_422_is_fastapis_validation_error(client):
    schema = client.get("/openapi.json").json()
    refused = schema["paths"]["/api/v1/results"]["post"]["responses"]["422"]
    ref = refused["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/HTTPValidationError"
    item = schema["components"]["schemas"]["ValidationError"]
    assert {"loc", "msg", "type"} <= set(item["required"])
    entries = schema["components"]["schemas"]["ResultsIn"]["properties"]["entries"]
    assert entries["minItems"] == 1


@pytest.mark.postgres
def test_a_nul_character_is_422_on_postgresql_not_503(pg_url):
    """PostgreSQL cannot store a NUL in text: it once answered 503 with Retry-After, an
    invitation to retry forever."""
    for client in open_store(pg_url):
        body = b'{"device": "PG\\u0000GPU", "entries": [%s]}' % _entry_text().encode()
        detail = details(post(client, body))
        assert detail[0]["loc"] == ["body", "device"]
        config_key = b'{"device": "PG GPU", "entries": [%s]}' % _entry_text().replace(
            '"ROWS"', '"RO\\u0000WS"').encode()
        assert details(post(client, config_key))[0]["loc"][:4] == ["body", "entries", 0, "config"]
        assert client.get("/api/v1/gpus").json() == []
