"""`suite_summary.py`: a suite's results at a glance, per kernel and quant mode, computed from its
JSON; each committed results folder holds its suite, the plots of `kerneltune report`, the
device-code fingerprints of the shipped table and a README whose table is the summary of that
suite, as is the top-level README's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from suite_summary import groups, markdown, summarize

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
GPUS = ["nvidia-h100-80gb-hbm3", "nvidia-h200"]


def shape(m: int, n: int, ours: float | None, default: float, peers: dict[str, float],
          frac: float = 0.9, kernel: str = "rmsnorm_fwd", **options: str) -> list[dict]:
    base = {"kernel": kernel, "m": m, "n": n, "dtype": "bfloat16", "options": options}
    rows = [{**base, "impl": "copy (same bytes)", "gpu_us": 0.5 * default}]
    if ours is None:
        rows.append({**base, "impl": "kerneltune", "error": "out of memory"})
    else:
        rows.append({**base, "impl": "kerneltune", "gpu_us": ours, "frac_copy": frac})
    rows.append({**base, "impl": "kerneltune-default", "gpu_us": default, "frac_copy": 0.1})
    rows += [{**base, "impl": name, "gpu_us": us} for name, us in peers.items()]
    return rows


def test_the_numbers_are_kerneltunes_against_its_fastest_peer() -> None:
    rows = (shape(1, 1024, 2.0, 2.5, {"liger": 3.0, "torch.compile": 4.0}, frac=0.01)
            + shape(4096, 1024, 10.0, 11.0, {"liger": 9.7, "torch.compile": 12.0}, frac=0.80)
            + shape(4096, 2048, 20.0, 19.0, {"liger": 25.0}, frac=0.92)
            + shape(16384, 1024, 30.0, 31.0, {"liger": 33.0}, frac=0.95)
            + shape(16384, 2048, None, 60.0, {"liger": 120.0}))  # out of memory: the default
    s = summarize(rows)
    assert (s["shapes"], s["ran"]) == (5, 5)
    # M >= 4096 only; the default's time where the tuned config did not run, with its fraction
    assert s["frac_median"] == pytest.approx(0.86) and s["frac_lowest"] == (0.1, (16384, 2048))
    assert s["ratio_lowest"] == (pytest.approx(0.97), (4096, 1024), "liger")
    assert s["ratio_median"] == pytest.approx(1.25)  # 1.5, 0.97, 1.25, 1.1, 2.0
    assert s["behind"] == 1  # 0.97: more than 2% behind


def test_a_shape_where_kerneltune_did_not_run_is_counted_apart() -> None:
    rows = shape(4096, 1024, None, 5.0, {"liger": 4.0})
    rows = [r for r in rows if r["impl"] != "kerneltune-default"]
    s = summarize(rows)
    assert (s["shapes"], s["ran"]) == (1, 0) and s["frac_median"] is None
    assert s["ratio_lowest"] is None and s["behind"] == 0


def test_the_table_has_a_line_per_kernel_and_quant_mode() -> None:
    result = {"rows": shape(4096, 1024, 10.0, 11.0, {"liger": 12.0})
              + shape(4096, 1024, 5.0, 5.0, {"torch.compile": 10.0}, frac=0.5,
                      kernel="rmsnorm_quant_fwd", quant="int8")
              + shape(4096, 1024, 4.0, 5.0, {"torch.compile": 10.0}, frac=0.6,
                      kernel="rmsnorm_quant_fwd", quant="fp8")
              + shape(4096, 1024, 4.0, 5.0, {"torch.compile": 4.0}, kernel="layernorm_fwd")}
    assert list(groups(result["rows"])) == ["rmsnorm_fwd", "rmsnorm_quant_fwd-int8",
                                            "rmsnorm_quant_fwd-fp8", "layernorm_fwd"]
    lines = markdown(result).splitlines()
    assert lines[2:] == [
        "| `rms_norm` forward | 1 of 1 | 0.90 | 0.90 (4096 x 1024) | 1.20 | "
        "1.20 (4096 x 1024, liger) | 0 |",
        "| `rms_norm_quant` int8 | 1 of 1 | 0.50 | 0.50 (4096 x 1024) | 2.00 | "
        "2.00 (4096 x 1024, torch.compile) | 0 |",
        "| `rms_norm_quant` fp8 | 1 of 1 | 0.60 | 0.60 (4096 x 1024) | 2.50 | "
        "2.50 (4096 x 1024, torch.compile) | 0 |",
        "| `layer_norm` forward | 1 of 1 | 0.90 | 0.90 (4096 x 1024) | 1.00 | "
        "1.00 (4096 x 1024, torch.compile) | 0 |"]
    short = markdown(result, short=True).splitlines()
    assert short[2] == "| `rms_norm` forward | 0.90 | 1.20 (1.20) |"


def test_rows_that_list_their_options_in_another_order_are_one_group() -> None:
    rows = shape(4096, 4096, 10.0, 11.0, {"torch.compile": 12.0},
                 kernel="rmsnorm_group_quant_fwd", quant="fp8", group_size="128")
    rows[0]["options"] = {"group_size": "128", "quant": "fp8"}  # the copy's, in another order
    assert list(groups(rows)) == ["rmsnorm_group_quant_fwd-128-fp8"]
    lines = markdown({"rows": rows}).splitlines()
    assert lines[2].startswith("| `rms_norm_group_quant` fp8, groups of 128 | 1 of 1 | 0.90 |")


def test_the_script_prints_the_table(tmp_path) -> None:
    path = tmp_path / "suite.json"
    result = {"device": "NVIDIA H200", "rows": shape(4096, 1024, 10.0, 11.0, {"liger": 12.0})}
    path.write_text(json.dumps(result))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for extra in ([], ["--short"]):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite_summary.py"),
                               str(path), *extra], env=env, capture_output=True, text=True,
                              check=True)
        assert done.stdout == markdown(result, short=bool(extra))


@pytest.mark.parametrize("gpu", GPUS)
def test_a_results_folder_holds_its_suite_its_plots_and_a_readme_of_them(gpu) -> None:
    folder = RESULTS / gpu
    result = json.loads((folder / "suite.json").read_text())
    files = sorted(p.name for p in folder.iterdir())
    plots = sorted(f"{name}.png" for name in groups(result["rows"]))  # as `kerneltune report`
    # beside them, the device-code fingerprints of the shipped table's entries (device_code.py)
    # and, where measured, the public functions' eager cost (eager_cost.py), transformers models
    # (hf_models.py) and the closed loop on a model (hf_models.py, search_study.py)
    # and another GPU's picks timed here (transfer.py), every config of a kernel's keys timed
    # (search_study.py) and an off-table key tuned beside its neighbour (kerneltune tune)
    extra = [f for f in ("eager.json", "models.json", "closed-loop.json", "transfer.json",
                         "layernorm-fwd-configs.json", "quant-5376-tune.json") if f in files]
    assert files == sorted(["README.md", "device-code.json", "suite.json", *plots, *extra])
    for name in extra:
        assert json.loads((folder / name).read_text())["device"] == result["device"]
        assert f"`{name}`" in (folder / "README.md").read_text()
    readme = (folder / "README.md").read_text()
    assert markdown(result) in readme  # the results at a glance are this suite's
    for plot in plots:
        assert f"({plot})" in readme
    assert result["device"] in readme and result["env"]["driver"] in readme
    assert "15edba4" in readme and "`device-code.json`" in readme


def test_the_top_readme_shows_each_gpus_suite_at_a_glance() -> None:
    readme = (ROOT / "README.md").read_text()
    for gpu in GPUS:
        result = json.loads((RESULTS / gpu / "suite.json").read_text())
        assert markdown(result, short=True) in readme, gpu
        assert f"benchmarks/results/{gpu}/README.md" in readme
    assert "15edba4" in readme
