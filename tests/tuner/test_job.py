"""Jobs: presets, keys and kernel references."""

from __future__ import annotations

import pytest

from kerneltune.kernels import REGISTRY
from kerneltune.tuner.job import (
    COMMON_HIDDEN,
    M_BUCKETS,
    PRESETS,
    Job,
    preset_sizes,
    read_keys,
    resolve_spec,
)


def test_presets_cover_the_common_hidden_sizes():
    required = {2048, 2560, 3072, 3584, 4096, 5120, 7168, 8192, 14336, 16384}
    assert required <= set(COMMON_HIDDEN) <= set(PRESETS["all"])
    assert preset_sizes(["llama3-8b", "qwen2.5-7b"]) == [3584, 4096, 14336, 18944]
    assert M_BUCKETS[0] == 1 and M_BUCKETS[-1] == 65536 and len(M_BUCKETS) == 17
    with pytest.raises(ValueError, match="unknown preset"):
        preset_sizes(["llama9"])


def test_keys_cover_the_product_in_a_fixed_order():
    job = Job(kernels=["rmsnorm_fwd"], ns=[4096, 2048, 4096], dtypes=["float16", "bfloat16"],
              m_buckets=[64, 1])
    keys = job.keys("GPU X")
    assert len(keys) == 2 * 2 * 2
    assert keys == sorted(keys)
    assert {(k.dtype, k.n, k.m) for k in keys} == {
        (d, n, m) for d in ("float16", "bfloat16") for n in (2048, 4096) for m in (1, 64)}
    assert all(k.device == "GPU X" and k.spec_ref == "rmsnorm_fwd" for k in keys)
    assert keys[0].problem().kernel == "rmsnorm_fwd"


def test_a_job_of_listed_keys_has_those_alone():
    listed = [("rmsnorm_fwd", "bfloat16", 4096, 64), ("rmsnorm_fwd", "float16", 2048, 1)]
    job = Job(kernels=["rmsnorm_fwd"], ns=[2048, 4096], dtypes=["bfloat16", "float16"],
              m_buckets=[1, 64], only=[*listed, listed[0]])
    assert [(k.kernel, k.dtype, k.n, k.m) for k in job.keys("GPU X")] == sorted(listed)
    outside = Job(kernels=["rmsnorm_fwd"], ns=[2048], m_buckets=[1],
                  only=[("rmsnorm_fwd", "bfloat16", 4096, 1)])
    with pytest.raises(ValueError, match=r"outside the job.*4096"):
        outside.keys("GPU X")


def test_keys_are_read_from_json():
    text = '[{"kernel": "rmsnorm_fwd", "n": 4096, "m": 3}, ' \
           '{"kernel": "rmsnorm_bwd", "n": 2048, "m": 1, "dtype": "float16"}]'
    assert read_keys(text) == [("rmsnorm_fwd", "bfloat16", 4096, 4),
                               ("rmsnorm_bwd", "float16", 2048, 1)]


@pytest.mark.parametrize(("text", "message"), [
    ("[{", "not JSON"),
    ("[]", "non-empty JSON list"),
    ('{"kernel": "rmsnorm_fwd"}', "non-empty JSON list"),
    ('[{"kernel": "rmsnorm_fwd", "n": 4096}]', "'n': 4096"),
    ('[{"kernel": "rmsnorm_fwd", "n": 4096, "m": 0}]', "'m': 0"),
    ('[{"kernel": "rmsnorm_fwd", "n": "4096", "m": 1}]', "'n': '4096'"),
    ('[{"kernel": "rmsnorm_fwd", "n": 4096, "m": 1, "rows": 2}]', "'rows': 2"),
])
def test_bad_key_lists_are_refused_naming_the_item(text, message):
    with pytest.raises(ValueError, match=message):
        read_keys(text)


@pytest.mark.parametrize("bad", [
    {"m_buckets": [3]}, {"ns": []}, {"dtypes": ["int8"]}, {"sampler": "grid"}, {"trials": 0},
    {"kernels": ["nope"]}, {"batch": 0}, {"precompile": -1}, {"retime_within": -0.01},
    {"retime_within": float("nan")}, {"timing_ms": 0}, {"timing_ms": float("nan")},
])
def test_bad_jobs_are_refused(bad):
    with pytest.raises(ValueError):
        Job(**{"kernels": ["rmsnorm_fwd"], "ns": [64], **bad}).specs()


def test_kernels_by_reference():
    assert resolve_spec("rmsnorm_fwd") is REGISTRY["rmsnorm_fwd"]
    spec = resolve_spec("tuner.faulty_kernels:SPEC")
    assert spec.name == "faulty_double"
    with pytest.raises(ValueError, match="not a KernelSpec"):
        resolve_spec("tuner.faulty_kernels:MODES")
    with pytest.raises(ValueError, match="cannot load"):
        resolve_spec("tuner.no_such_module:SPEC")
