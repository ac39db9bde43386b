"""`benchmarks/hf_models.py`: run as a script on a tiny Llama under the interpreter, each
variant in its own process, every requested row present, the patched models' norms routed and
their logits the unpatched model's, Liger skipped where it is not installed; the table's ratios
to unpatched and the cells it calls out, on rows made by hand."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from .script import run_script

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from hf_models import (
    LOGITS_TOL,
    complete_runs,
    crop_cache,
    kv_cache_name,
    markdown,
    merge,
    model_config,
    parse_args,
    plan,
    run_all,
    variant_modes,
)

VARIANTS = ["unpatched", "patch_transformers", "patch_model", "liger"]
MODES = ["prefill", "decode"]


def test_tiny_llama_every_variant_and_mode(tmp_path):
    pytest.importorskip("transformers")
    out, md = tmp_path / "hf.json", tmp_path / "hf.md"
    done = run_script("hf_models.py", "--tiny", "--seq", "8", "--prompt", "8", "--iters", "1",
                      "--warmup", "1", "--modes", ",".join(MODES), "--models", "llama3-8b",
                      "--variants", ",".join(VARIANTS), "--out", str(out), "--md", str(md),
                      "--markdown")
    result = json.loads(out.read_text())
    rows = {(r["variant"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {(v, m) for v in VARIANTS for m in MODES}
    assert all(r["model"] == "llama3-8b" and r["device"] == result["device"]
               for r in result["rows"])
    for mode in MODES:
        for variant in ("unpatched", "patch_transformers", "patch_model"):
            r = rows[(variant, mode)]
            assert "error" not in r, r
            assert math.isfinite(r["ms"]) and r["ms"] > 0
            assert r["logits_ok"] and r["logits_rel_diff"] <= LOGITS_TOL
            assert r["norms"] == 3  # two per layer, the final norm
            assert r["norms_routed"] == (0 if variant == "unpatched" else 3)
        liger = rows[("liger", mode)]
        if importlib.util.find_spec("liger_kernel") is None:
            assert liger["skipped"] == "liger_kernel is not installed"
        else:  # Liger's kernels may not run under the interpreter: an error, not a skip
            assert "skipped" not in liger and ("ms" in liger or "error" in liger)
    assert result["device"] and result["env"]["torch"]
    assert result["versions"]["transformers"] and result["versions"]["torch"]
    assert "liger-kernel" in result["versions"] and "kernels" in result["versions"]
    assert result["args"]["seq"] == 8 and result["models"]["llama3-8b"]["model_type"] == "llama"
    table = md.read_text()
    assert table.startswith("| model | mode | " + " | ".join(VARIANTS) + " |")
    assert "| llama3-8b | prefill |" in table and "| llama3-8b | decode |" in table
    assert table in done.stdout
    assert "Slower than unpatched by more than 2%" in table
    # progress: one line per (model, variant)
    assert sum(line.startswith("[") for line in done.stderr.splitlines()) == len(VARIANTS)


def row(variant: str, mode: str, ms: float | None = None, **extra) -> dict:
    r = {"model": "m", "variant": variant, "mode": mode, "device": "d", **extra}
    return {**r, "ms": ms} if ms is not None else r


def test_table_ratios_and_what_it_calls_out(tmp_path):
    rows = [row("unpatched", "prefill", 4.0), row("patch_model", "prefill", 3.92),
            row("liger", "prefill", skipped="liger_kernel is not installed"),
            row("unpatched", "decode", 2.0), row("patch_model", "decode", 2.1),
            row("liger", "decode", error="RuntimeError: boom"),
            row("kernelize", "prefill", 4.5, norms=7, norms_routed=0),
            row("kernelize", "decode", 2.04, norms=7, norms_routed=7),
            row("fuse_residuals", "prefill", 1.0, logits_ok=False, logits_rel_diff=0.4)]
    lines = markdown(rows).splitlines()
    assert lines[0] == ("| model | mode | unpatched | patch_model | kernelize | fuse_residuals "
                        "| liger |")
    assert lines[2] == ("| m | prefill | 4.00 | 3.92 (0.98x) | not routed | 1.00 (0.25x) ! "
                        "| skipped |")
    assert lines[3] == "| m | decode | 2.00 | 2.10 (1.05x) | 2.04 (1.02x) | - | error |"
    text = "\n".join(lines)
    # 2.1 is 5% slower, 2.04 2% and not more; kernelize's 4.5 at prefill is transformers' own
    # code, not compared
    assert "Slower than unpatched by more than 2%: m decode patch_model (1.05x)." in text
    assert "m prefill fuse_residuals (0.4)" in text
    assert "routed/all): m kernelize 0/7." in text
    assert "- m decode liger: RuntimeError: boom" in text
    assert "more than 2%: none." in markdown(rows[:2])

    # runs split in parts: one table of them all
    for k, part in enumerate((rows[:3], rows[3:])):
        (tmp_path / f"{k}.json").write_text(json.dumps({"device": "d", "args": {}, "rows": part}))
    merged = merge([str(tmp_path / "0.json"), str(tmp_path / "1.json")])
    assert merged["rows"] == rows and [p["file"] for p in merged["parts"]] == ["0.json", "1.json"]


def test_the_modes_each_variant_runs_in_their_order():
    assert variant_modes("patch_model_compile_kernels", MODES) == []
    assert variant_modes("patch_model_compile_kernels", ["decode", "prefill_compiled"]) == [
        "prefill_compiled"]
    assert variant_modes("patch_model", ["prefill_compiled", "decode", "prefill"]) == [
        "prefill", "decode", "prefill_compiled"]


def test_decode_steps_all_run_on_the_prompts_cache():
    """Each timed decode step starts from the prompt's cache: cut back, the cache holds the
    prompt's keys as they were, and the next step's logits are the first step's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_type, config = model_config("gemma3-12b", tiny=True, layers=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(model_type, **config)).eval()
    prompt, step = torch.randint(256, (2, 6)), torch.randint(256, (2, 1))
    name = kv_cache_name(model)
    with torch.inference_mode():
        cache = getattr(model(prompt, use_cache=True), name)
        keys = cache.layers[0].keys.clone()
        first = model(step, use_cache=True, **{name: cache}).logits
        model(step, use_cache=True, **{name: cache})
        assert cache.get_seq_length() == 8
        crop_cache(cache, 6)
        assert cache.get_seq_length() == 6
        assert torch.equal(cache.layers[0].keys, keys)
        crop_cache(cache, 6)  # already the prompt's: nothing to cut
        assert cache.get_seq_length() == 6
        again = model(step, use_cache=True, **{name: cache}).logits
    torch.testing.assert_close(again, first)


def test_resume_keeps_whole_runs_and_redoes_the_rest(tmp_path):
    """A run stopped after the unpatched model (its rows in ``.partial``, the next process's
    row an error) goes on: the unpatched row kept as it was, the other run made again and
    checked against a reference built again."""
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    common = ("--tiny", "--seq", "8", "--iters", "1", "--warmup", "1", "--modes", "prefill",
              "--models", "llama3-8b", "--out", str(out))
    run_script("hf_models.py", *common, "--variants", "unpatched")
    first = json.loads(out.read_text())["rows"]
    partial = Path(f"{out}.partial")
    partial.write_text(json.dumps({"rows": [*first, row("patch_model", "prefill",
                                                        error="timed out after 1 s")]}))
    out.unlink()
    done = run_script("hf_models.py", *common, "--variants", "unpatched,patch_model",
                      "--resume")
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["unpatched"] == first[0]  # kept, not measured again
    again = rows["patch_model"]
    assert "error" not in again and again["logits_ok"]
    assert again["logits_rel_diff"] <= LOGITS_TOL  # a reference to compare with was made
    assert not partial.exists()
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 2 and "unpatched (" in progress[0] and "reference only" in progress[0]


def test_complete_runs_are_those_with_every_mode_and_no_error():
    args = parse_args(["--variants", "unpatched,liger", "--modes", "prefill,decode"])
    rows = [row("unpatched", "prefill", 1.0), row("unpatched", "decode", 2.0),
            row("unpatched", "train_step", 3.0),  # a mode this run does not ask for
            row("liger", "prefill", 1.0), row("liger", "decode", error="timed out")]
    rows = [{**r, "model": "llama3-8b"} for r in rows]
    kept = complete_runs(rows, args)
    assert [(r["variant"], r["mode"]) for r in kept] == [
        ("unpatched", "prefill"), ("unpatched", "decode")]
    skipped = [{**r, "variant": "liger", "skipped": "liger_kernel is not installed"}
               for r in rows[:2]]
    assert len(complete_runs(rows[:2] + skipped, args)) == 4


def test_rounds_take_turns_after_the_reference():
    args = parse_args(["--models", "llama3-8b", "--variants", "unpatched,patch_model,liger",
                       "--modes", "prefill,decode", "--rounds", "3"])
    modes = ["prefill", "decode"]
    order = [(v, k) for _, v, _, k in plan(args)]
    assert order == [("unpatched", 0), ("patch_model", 0), ("liger", 0),
                     ("patch_model", 1), ("liger", 1), ("unpatched", 1),
                     ("liger", 2), ("unpatched", 2), ("patch_model", 2)]
    assert all(m == "llama3-8b" and ms == modes for m, _, ms, _ in plan(args))
    # unpatched's first round kept: its next process comes first, and makes the reference
    later = plan(args, {("llama3-8b", "unpatched", 0), ("llama3-8b", "patch_model", 0)})
    assert [(v, k) for _, v, _, k in later] == [
        ("unpatched", 1), ("liger", 0), ("patch_model", 1), ("liger", 1), ("liger", 2),
        ("unpatched", 2), ("patch_model", 2)]
    every = {("llama3-8b", v, k) for v in args.variants for k in range(3)}
    assert plan(args, every) == []
    # every unpatched process kept: one with no modes makes the reference again
    assert plan(args, every - {("llama3-8b", "liger", 2)}) == [
        ("llama3-8b", "unpatched", [], 0), ("llama3-8b", "liger", modes, 2)]
    # a run without unpatched has its reference made all the same
    alone = parse_args(["--models", "qwen3-8b", "--variants", "liger", "--modes", "prefill"])
    assert plan(alone) == [("qwen3-8b", "unpatched", [], 0), ("qwen3-8b", "liger", ["prefill"], 0)]


def test_a_cell_is_the_median_of_its_rounds_and_a_wide_spread_is_called_out():
    rows = [row("unpatched", "decode", ms, round=k) for k, ms in enumerate((2.0, 2.4, 2.1))]
    rows += [row("patch_model", "decode", ms, round=k) for k, ms in enumerate((2.1, 2.0, 9.0))]
    rows += [row("patch_model", "decode", 2.05, round=2)]  # a later row of a round wins
    lines = markdown(rows).splitlines()
    assert lines[2] == "| m | decode | 2.10 | 2.05 (0.98x) |"
    text = "\n".join(lines)
    assert "more than 2%: none." in text
    assert "Rounds apart by more than 5% (fastest-slowest ms): m decode unpatched (2.00-2.40)." \
        in text
    assert "Rounds apart" not in markdown(rows[:1] + rows[3:4])
    # a round that failed: the others' median, and the failure listed
    failed = [*rows, row("unpatched", "decode", round=3, error="timed out after 9 s")]
    text = markdown(failed)
    assert "| m | decode | 2.10 | 2.05 (0.98x) |" in text
    assert "- m decode unpatched: timed out after 9 s" in text


def test_rounds_are_at_least_one():
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])


def test_complete_runs_are_counted_a_round_at_a_time():
    args = parse_args(["--models", "llama3-8b", "--variants", "unpatched",
                       "--modes", "prefill", "--rounds", "2"])
    rows = [{**row("unpatched", "prefill", 1.0, round=0), "model": "llama3-8b"},
            {**row("unpatched", "prefill", error="timed out", round=1), "model": "llama3-8b"}]
    kept = complete_runs(rows, args)
    assert kept == rows[:1]
    assert plan(args, {("llama3-8b", "unpatched", 0)}) == [
        ("llama3-8b", "unpatched", ["prefill"], 1)]


def test_a_process_that_outlives_its_timeout_leaves_an_error_row_per_mode():
    args = parse_args(["--tiny", "--models", "llama3-8b", "--variants", "patch_model",
                       "--modes", "prefill,decode", "--timeout", "1"])
    rows = run_all(args)  # each process is stopped while it still imports torch
    assert [(r["variant"], r["mode"], r["error"]) for r in rows] == [
        ("patch_model", "prefill", "timed out after 1 s"),
        ("patch_model", "decode", "timed out after 1 s")]
