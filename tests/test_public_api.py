"""The package's public face: what `import kerneltune` gives, and what it does not import."""

from __future__ import annotations

import subprocess
import sys

import kerneltune

SERVICE_DEPS = ("fastapi", "optuna", "sqlalchemy", "uvicorn", "httpx", "starlette", "pydantic")


def imported_modules(code: str) -> set[str]:
    """Top-level modules imported by running `code` in a fresh interpreter (-X importtime)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                         capture_output=True, text=True, check=True, timeout=300)
    names = set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_import_pulls_in_no_service_or_tuner_dependency():
    names = imported_modules("import kerneltune")
    assert "kerneltune" in names
    assert not names & set(SERVICE_DEPS), names & set(SERVICE_DEPS)
    assert "torch" not in names  # the command line and the service start without torch


def test_using_the_runtime_pulls_in_no_service_dependency():
    code = ("import os; os.environ['TRITON_INTERPRET'] = '1'\n"
            "import torch, kerneltune\n"
            "kerneltune.rms_norm(torch.randn(2, 16), torch.ones(16))\n"
            "kerneltune.patch_model(torch.nn.Linear(2, 2))\n"
            "kerneltune.explain('rmsnorm_fwd', (1, 16, 'float32'))")
    names = imported_modules(code)
    assert {"torch", "triton", "kerneltune"} <= names
    assert not names & set(SERVICE_DEPS), names & set(SERVICE_DEPS)


def test_public_names():
    for name in ("rms_norm", "add_rms_norm", "rms_norm_quant", "rms_norm_fake_quant", "RMSNorm",
                 "patch_model", "unpatch_model", "explain", "patch_transformers",
                 "unpatch_transformers"):
        assert name in kerneltune.__all__ and name in dir(kerneltune)
        assert getattr(kerneltune, name) is getattr(kerneltune.runtime, name)
    assert callable(kerneltune.runtime.reset) and kerneltune.__version__
    try:
        kerneltune.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("unknown attribute did not raise")
