"""`POST /api/v1/misses` and `GET /api/v1/misses/{gpu}` through a real uvicorn process: reports
add up without a token, are bounded in size and rate, and a key leaves the untuned list once a
current entry for it is published."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from .live import KERNEL, TOKEN, entry_json, seeded_entry, start_server, stop_server

AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEVICE = "NVIDIA REPORTING-GPU"


def key(n: int = 5376, m: int = 4096, processes: int = 1, rows: list[int] | None = None,
        kernel: str = KERNEL) -> dict:
    return {"kernel": kernel, "dtype": "bfloat16", "n": n, "m": m, "processes": processes,
            "rows": rows if rows is not None else [3000]}


def listed(client, device: str = DEVICE, **params) -> list[dict]:
    r = client.get(f"/api/v1/misses/{quote(device)}", params=params)
    assert r.status_code == 200, r.text
    return r.json()["keys"]


def test_reports_add_up_and_are_listed_by_processes(client):
    r = client.post("/api/v1/misses", json={"device": DEVICE, "keys": [
        key(), key(n=2880, m=64, processes=4, rows=[33, 64])]})
    assert r.status_code == 202
    assert r.json() == {"device": DEVICE, "recorded": 2, "unknown_kernels": []}
    assert client.post("/api/v1/misses", json={"device": DEVICE, "keys": [
        key(processes=2, rows=[2500, 4096])]}).status_code == 202
    keys = listed(client)
    assert [(k["n"], k["m"], k["processes"], k["rows"]) for k in keys] == [
        (2880, 64, 4, [33, 64]), (5376, 4096, 3, [2500, 3000, 4096])]
    assert not any(k["tuned"] for k in keys)
    gpus = [g["name"] for g in client.get("/api/v1/gpus").json()]
    assert DEVICE not in gpus  # reporting is not having a table


def test_a_published_entry_takes_its_key_off_the_untuned_list(client):
    device = "NVIDIA REPORTED-THEN-TUNED"
    assert client.post("/api/v1/misses", json={"device": device, "keys": [
        key(n=4096, m=64), key(n=8192, m=64)]}).status_code == 202
    r = client.post("/api/v1/results", headers=AUTH,
                    json={"device": device, "entries": [entry_json(seeded_entry(4096, 64))]})
    assert r.status_code == 200, r.text
    assert [k["n"] for k in listed(client, device)] == [8192]
    every = {k["n"]: k["tuned"] for k in listed(client, device, untuned="false")}
    assert every == {4096: True, 8192: False}


def test_keys_of_a_kernel_the_service_lacks_are_left_out_and_named(client):
    """A runtime with a plug-in kernel the service does not have still reports the others."""
    device = "NVIDIA PLUGIN-REPORT"
    r = client.post("/api/v1/misses", json={"device": device, "keys": [
        key(kernel="someones_plugin_fwd"), key(n=2048)]})
    assert r.status_code == 202, r.text
    assert r.json() == {"device": device, "recorded": 1, "unknown_kernels": ["someones_plugin_fwd"]}
    assert [(k["kernel"], k["n"]) for k in listed(client, device)] == [(KERNEL, 2048)]


@pytest.mark.parametrize(("bad", "where"), [
    (key(m=3000), ["body", "keys", 0, "m"]),
    (key(n=0), ["body", "keys", 0, "n"]),
    (key(processes=0), ["body", "keys", 0, "processes"]),
    (key(rows=[0]), ["body", "keys", 0, "rows", 0]),
])
def test_a_bad_key_is_422_and_records_nothing(client, bad, where):
    device = "NVIDIA BAD-REPORT"
    r = client.post("/api/v1/misses", json={"device": device, "keys": [bad]})
    assert r.status_code == 422, r.text
    assert where in [d["loc"] for d in r.json()["detail"]]
    assert listed(client, device) == []


def test_reports_are_bounded_in_keys_and_bytes(client):
    many = [key(n=n) for n in range(1, 258)]
    r = client.post("/api/v1/misses", json={"device": DEVICE, "keys": many})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "keys"]
    padded = {"device": DEVICE, "keys": [key()], "pad": "x" * (70 << 10)}
    r = client.post("/api/v1/misses", json=padded)
    assert r.status_code == 413 and "65536 bytes" in r.json()["detail"]
    chunks = iter([b'{"device": "x", "keys": [', *[b" " * 1024] * 70])  # no Content-Length
    r = client.post("/api/v1/misses", content=chunks,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_a_client_past_its_rate_gets_429(tmp_path):
    server = start_server(tmp_path, f"sqlite:///{tmp_path / 'kt.db'}",
                          extra_env={"KERNELTUNE_REPORTS_PER_S": "0.2",
                                     "KERNELTUNE_REPORTS_BURST": "3"})
    try:
        with server.client() as client:
            codes = [client.post("/api/v1/misses", json={"device": DEVICE, "keys": [key()]})
                     for _ in range(4)]
            assert [r.status_code for r in codes] == [202, 202, 202, 429]
            assert 1 <= int(codes[-1].headers["retry-after"]) <= 5
            assert listed(client)[0]["processes"] == 3
            assert client.get("/healthz").status_code == 200  # reads are not rationed
    finally:
        stop_server(server)
