"""The table format: canonical, lossless, and strict about what it reads."""

from __future__ import annotations

import json

import pytest

from kerneltune import table as tbl


def _table() -> tbl.Table:
    env = tbl.Env(triton="3.6.0", torch="2.11.0+cu130", cuda="13.0", driver="580.159.04")
    return tbl.Table(
        device="NVIDIA H100 80GB HBM3", env=env, copy_gbps=3010.0, compute_capability="9.0",
        entries=[
            tbl.Entry("rmsnorm_fwd", "bfloat16", 4096, 2048,
                      {"BLOCK_N": 4096, "SINGLE": True, "num_warps": 8}, 12.3, 2724.0, 13.6, 40,
                      "9f2c", frac_copy=0.905, default_config={"BLOCK_N": 4096}, env=env),
            tbl.Entry("rmsnorm_bwd", "float16", 8192, 1, {"BLOCK_N": 1024},
                      3.0, 40.0, 3.0, 8, "ab"),
        ],
    )


def test_round_trip_is_lossless_and_canonical(tmp_path) -> None:
    t = _table()
    path = tbl.save(t, tmp_path / "t.json")
    back = tbl.load(path)
    assert back == t.sorted()
    assert tbl.dumps(back) == path.read_text()
    assert back.entries[0].kernel == "rmsnorm_bwd"  # canonical order: by kernel first
    assert back.compute_capability == "9.0"
    plain = tbl.Table(t.device, entries=t.entries)  # a table without one writes none
    assert "compute_capability" not in tbl.table_to_dict(plain)
    fwd = back.index()[("rmsnorm_fwd", "bfloat16", 4096, 2048)]
    assert fwd.speedup == pytest.approx(13.6 / 12.3)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema=2), "unsupported schema"),
        (lambda d: d["entries"][0].update(dtype="int8"), "'dtype' must be one of"),
        (lambda d: d["entries"][0].update(m=3000), "power-of-two bucket"),
        (lambda d: d["entries"][0].update(us=float("nan")), "finite number"),
        (lambda d: d["entries"][0].update(config={}), "non-empty object"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "duplicate"),
        (lambda d: d.pop("device"), "'device' must be a name"),
        (lambda d: d.update(device=" \v\t"), "'device' must be a name"),
        (lambda d: d.update(compute_capability=9.0), "'compute_capability' must be like"),
        (lambda d: d.update(compute_capability="sm_90"), "'compute_capability' must be like"),
    ],
)
def test_rejects_malformed(mutate, message: str) -> None:
    doc = tbl.table_to_dict(_table())
    mutate(doc)
    with pytest.raises(tbl.TableError, match=message):
        tbl.loads(json.dumps(doc))


def test_rejects_non_json() -> None:
    with pytest.raises(tbl.TableError, match="not JSON"):
        tbl.loads(b"{not json")


@pytest.mark.parametrize(("m", "bucket"), [(0, 1), (1, 1), (2, 2), (3, 4), (64, 64), (65, 128)])
def test_m_bucket(m: int, bucket: int) -> None:
    assert tbl.m_bucket(m) == bucket


def test_device_slug() -> None:
    assert tbl.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert tbl.shipped_table_path("NVIDIA H200").name == "nvidia-h200.json"
    with pytest.raises(ValueError):
        tbl.device_slug("///")


def test_a_16_bit_dtype_looks_to_the_other_after_itself():
    assert tbl.with_same_width("float16") == ["float16", "bfloat16"]
    assert tbl.with_same_width("bfloat16") == ["bfloat16", "float16"]
    assert tbl.with_same_width("float32") == ["float32"]
