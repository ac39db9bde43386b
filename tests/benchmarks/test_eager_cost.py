"""`benchmarks/eager_cost.py` run as a script under the interpreter: every public function and
the training step are called, beside F.rms_norm, and written as rows with their ratios."""

from __future__ import annotations

import json

from .script import ROOT, run_script


def test_eager_cost_times_each_public_function_beside_torch(tmp_path):
    out = tmp_path / "eager.json"
    run_script("eager_cost.py", "--out", str(out), "--calls", "2", "--label", "here")
    result = json.loads(out.read_text())
    assert result["label"] == "here"
    assert result["source"] == str(ROOT / "src" / "kerneltune")
    rows = {(r["mode"], r["fn"]): r for r in result["rows"]}
    assert set(rows) == {
        *(("inference", f) for f in ("F.rms_norm", "rms_norm", "add_rms_norm",
                                     "rms_norm_quant int8", "rms_norm_quant fp8")),
        ("training", "F.rms_norm"), ("training", "rms_norm")}
    for r in rows.values():
        assert r["eager_us"] > 0
        base = rows[(r["mode"], "F.rms_norm")]["eager_us"]
        assert abs(r["ratio_to_F.rms_norm"] - r["eager_us"] / base) < 0.01 * r["eager_us"] / base
