"""End-to-end time of transformers models: unpatched, by each of kerneltune's routes, by Liger's.

Each model is built from its real config's sizes with `--layers` decoder layers (default 2),
random weights in bf16 on the device, nothing downloaded; `--tiny` builds a tiny model of the
same type instead (what the tests run on the CPU). Every variant runs in a fresh process of its
own, since patching transformers' classes (kerneltune's `patch_transformers`, Liger's patch) is
global to a process: the parent runs this script again with ``--child MODEL VARIANT MODES``,
which builds the model once, runs each mode on it and prints one JSON line per row.

Variants:

- ``unpatched``: transformers as installed.
- ``patch_transformers``: ``kerneltune.patch_transformers([model_type])`` before the model is
  built.
- ``patch_model``: ``kerneltune.patch_model(model)`` after it is built.
- ``kernelize``: ``kernels.kernelize`` under ``use_kernel_mapping(kerneltune.layers.mapping())``
  (no other mapping inherited), in the mode each run needs: ``Mode.INFERENCE``, ``Mode.TRAINING``,
  ``Mode.INFERENCE | Mode.TORCH_COMPILE``. Only norm classes transformers decorates with
  ``use_kernel_forward_from_hub("RMSNorm")`` are reached.
- ``fuse_residuals``: ``kerneltune.patch_transformers([model_type], fuse_residuals=True)``.
- ``liger``: Liger-Kernel's ``apply_liger_kernel_to_<type>`` with ``rms_norm=True`` and every
  other option of it off (rope, swiglu/geglu, cross entropy, fused linear cross entropy), before
  the model is built; skipped where liger_kernel is not installed.
- ``patch_model_compile_kernels``: ``patch_model`` with ``KERNELTUNE_COMPILE=kernels``;
  ``prefill_compiled`` only. Under torch.compile kerneltune's norms trace the torch formula for
  Inductor to fuse by default; this keeps its kernels there, as opaque custom ops. The other
  variants run with KERNELTUNE_COMPILE unset.

Modes (each time the median of `--iters` after `--warmup`, by CUDA events on a GPU, by the wall
clock on the CPU):

- ``prefill``: eager forward of 1 x `--seq` tokens under ``torch.inference_mode``, computing the
  last position's logits only (``logits_to_keep=1``), as generation's prefill does.
- ``prefill_compiled``: the same through ``torch.compile(model)``; the first call (compilation
  and all) is ``compile_s``, outside the timing.
- ``decode``: `--batch` sequences prefilled with a `--prompt`-token prompt (``use_cache=True``),
  then one step of one new token per sequence on that cache. The cache is cut back to the
  prompt before each step, outside the timing, so that every step runs the same shapes (with
  a cache that grew, every step met a new attention length, and one process's steps took 1.4x
  another's running the same code).
- ``train_step``: ``model.train()``, forward of 1 x `--seq` tokens with ``labels=input_ids``,
  ``loss.backward()``; gradients set to None before each step, outside the timing; no optimizer.

Weights are drawn per parameter from a generator seeded by the parameter's name, so every
variant's process builds the same model whatever its classes consume of the global RNG; norm
weights are drawn around their init (1, or 0 for Gemma's ``1 + w``) with std 0.3, so a route that
ignores them shows. Once per model and variant the eager logits of the last `CHECK_POSITIONS`
positions of the prefill input are compared with the unpatched model's (``logits_rel_diff``: max
abs difference over the largest abs logit; ``logits_ok``: finite and within `LOGITS_TOL`);
``prefill_compiled`` rows carry the compiled call's own. Each row also says how many of the
model's RMSNorm modules run kerneltune's or Liger's code (``norms_routed`` of ``norms``), and
``layers_fused`` for ``fuse_residuals``. A variant or mode that fails gives a row with the last
line of its traceback in "error"; the others still run. On a GPU each row has the mode's peak
allocated memory (``peak_gib``); the cache is emptied between modes. ``process_s`` is the wall
time of the row's process, start to end (what to plan a run by: each process imports, builds,
and compiles afresh). A process runs its modes in `RUN_ORDER`, compilation last.

`--rounds K` runs each (model, variant) in K processes, a round at a time (each round runs
every variant once, its order turned by one from the round before), so that a slow process or
a drift of the host over the run weighs on every variant alike; each row says its ``round``, a
cell of the table is the median of its rounds, and cells whose rounds spread by more than
`SPREAD` are called out under it. A host-bound mode (decode) needs this: single processes
running the same code have differed by 1.2x.

`--table` makes one result and table of several runs (say, one per model where a run must be
split). `--resume` keeps the (model, variant) runs that `--out` already holds whole, or that a
run stopped midway left in ``<out>.partial``, and runs the rest (with the unpatched model
built again for its reference logits alone): a run cut by a time limit goes on where it
stopped.

    PYTHONPATH=src python benchmarks/hf_models.py --out hf_models.json --md hf_models.md
    PYTHONPATH=src python benchmarks/hf_models.py --models llama3-8b --variants unpatched,liger \
        --modes prefill,decode --markdown --out llama.json
    PYTHONPATH=src python benchmarks/hf_models.py --table llama.json qwen.json gemma.json \
        --out hf_models.json --md hf_models.md      # runs split by model, merged
    PYTHONPATH=src python benchmarks/hf_models.py --out hf_models.json --resume  # goes on
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from result_files import write_json

#: name -> (model_type, the real config's sizes).
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-8b": ("llama", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192,
        tie_word_embeddings=False)),
    "qwen3-8b": ("qwen3", dict(
        hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=False)),
    "gemma3-12b": ("gemma3_text", dict(
        hidden_size=3840, intermediate_size=15360, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, vocab_size=262208, rms_norm_eps=1e-6, sliding_window=1024,
        query_pre_attn_scalar=256, max_position_embeddings=131072, tie_word_embeddings=True)),
    # hidden size 5376: off every shipped table (what `tune --from-misses` is shown on)
    "gemma3-27b": ("gemma3_text", dict(
        hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
        head_dim=128, vocab_size=262208, rms_norm_eps=1e-6, sliding_window=1024,
        query_pre_attn_scalar=168, max_position_embeddings=131072, tie_word_embeddings=True)),
}
DEFAULT_MODELS = ("llama3-8b", "qwen3-8b", "gemma3-12b")
#: What `--tiny` puts in place of the sizes (one layer).
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=256, max_position_embeddings=1024)
#: Config entries the tiny model keeps from the real one (the rest are sizes).
TINY_KEEPS = ("rms_norm_eps", "rope_theta", "tie_word_embeddings", "sliding_window")

VARIANTS = ("unpatched", "patch_transformers", "patch_model", "kernelize", "fuse_residuals",
            "liger", "patch_model_compile_kernels")
MODES = ("prefill", "prefill_compiled", "decode", "train_step")
#: The order a process runs its modes in: compilation last, so that a compiler failing hard
#: (or hanging) costs no other mode its row.
RUN_ORDER = ("prefill", "decode", "train_step", "prefill_compiled")
#: Variants that run some modes only.
VARIANT_MODES = {"patch_model_compile_kernels": ("prefill_compiled",)}
#: Each variant's KERNELTUNE_COMPILE (unset for the others).
COMPILE_SETTING = {"patch_model_compile_kernels": "kernels"}
#: Liger-Kernel's patch function per model type.
LIGER = {"llama": "apply_liger_kernel_to_llama", "qwen3": "apply_liger_kernel_to_qwen3",
         "gemma3_text": "apply_liger_kernel_to_gemma3_text"}
PACKAGES = ("torch", "triton", "transformers", "kernels", "liger-kernel", "kerneltune")

#: Positions whose logits are compared with the unpatched model's.
CHECK_POSITIONS = 16
#: The largest max abs difference of those logits, relative to the largest abs logit.
LOGITS_TOL = 0.1
#: Std of the norm weights around their init.
NORM_STD = 0.3
#: A cell slower than unpatched by more than this ratio is called out under the table.
SLOWER = 1.02
#: A cell whose rounds' slowest is slower than their fastest by more than this is called out.
SPREAD = 1.05


# -------------------------------------------------------------------- plan (parent)


def variant_modes(variant: str, modes: Sequence[str]) -> list[str]:
    """The modes of `modes` that `variant` runs, in the order they run (`RUN_ORDER`)."""
    allowed = VARIANT_MODES.get(variant, MODES)
    return [m for m in RUN_ORDER if m in modes and m in allowed]


def skip_reason(variant: str) -> str | None:
    """Why `variant` cannot run here (a package it needs is missing), or None."""
    needs = {"liger": "liger_kernel", "kernelize": "kernels"}.get(variant)
    if needs and importlib.util.find_spec(needs) is None:
        return f"{needs} is not installed"
    return None


def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def child_command(model: str, variant: str, modes: Sequence[str], ref_dir: str,
                  args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", model, variant,
           ",".join(modes) or "-", "--ref-dir", ref_dir, "--layers", str(args.layers),
           "--seq", str(args.seq), "--prompt", str(args.prompt), "--batch", str(args.batch),
           "--iters", str(args.iters), "--warmup", str(args.warmup)]
    return [*cmd, "--tiny"] if args.tiny else cmd


def run_child(model: str, variant: str, modes: Sequence[str], ref_dir: str,
              args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of one (model, variant) process; a row with an error for each mode it did not
    report (the process died or timed out)."""
    env = {k: v for k, v in os.environ.items() if k != "KERNELTUNE_COMPILE"}
    if variant in COMPILE_SETTING:
        env["KERNELTUNE_COMPILE"] = COMPILE_SETTING[variant]
    cmd = child_command(model, variant, modes, ref_dir, args)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout, check=False)
        out, err, failure = done.stdout, done.stderr, None
        if done.returncode:
            failure = f"process exited with status {done.returncode}: {_last_line(err)}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        failure = f"timed out after {args.timeout} s"
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        elif line.strip():
            err += line + "\n"
    reported = {r["mode"] for r in rows}
    rows += [{"model": model, "variant": variant, "mode": m,
              "error": failure or "not reported by its process"}
             for m in modes if m not in reported]
    if args.verbose or failure or any("error" in r for r in rows):
        sys.stderr.write("".join(f"  | {line}\n" for line in err.splitlines()[-40:]))
    return rows


def _progress(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        if "ms" in r:
            flag = "" if r.get("logits_ok", True) else " (logits differ)"
            parts.append(f"{r['mode']} {r['ms']:.3f} ms{flag}")
        else:
            parts.append(f"{r['mode']} {'skipped' if 'skipped' in r else 'error'}: "
                         f"{r.get('skipped') or r.get('error')}")
    return "; ".join(parts) or "reference only"


def earlier_rows(out: str | None) -> list[dict[str, Any]]:
    """The rows of a run written to `out` before, whole or stopped midway (its ``.partial``)."""
    for path in (Path(f"{out}.partial"), Path(out)) if out else ():
        if path.exists():
            return json.loads(path.read_text())["rows"]
    return []


def complete_runs(rows: Sequence[dict[str, Any]], args: argparse.Namespace
                  ) -> list[dict[str, Any]]:
    """The rows of the (model, variant, round) runs that `rows` hold whole: a row without an
    error for each mode the run has (a row that names no round is round 0's)."""
    have = {(r["model"], r["variant"], r.get("round", 0), r["mode"]) for r in rows
            if "error" not in r}
    whole = {(m, v, k) for m in args.models for v in args.variants for k in range(args.rounds)
             if all((m, v, k, mode) in have for mode in variant_modes(v, args.modes))}
    return [r for r in rows if (r["model"], r["variant"], r.get("round", 0)) in whole
            and r["mode"] in args.modes]


def plan(args: argparse.Namespace, done: set[tuple[str, str, int]] = frozenset()
         ) -> list[tuple[str, str, list[str], int]]:
    """The processes to run, in order: (model, variant, modes, round) for every round of every
    (model, variant) not `done`, model by model and round by round, each round's variants
    turned by one from the round before. A model's first unpatched process comes first, since
    it writes the reference logits the others are checked against; where none is left to run,
    a process of it with no modes makes them."""
    jobs = []
    variants = [v for v in args.variants if variant_modes(v, args.modes)]
    for model in args.models:
        todo = []
        for k in range(args.rounds):
            turn = k % len(variants) if variants else 0
            todo += [(model, v, variant_modes(v, args.modes), k)
                     for v in variants[turn:] + variants[:turn] if (model, v, k) not in done]
        if not todo:
            continue
        first = next((job for job in todo if job[1] == "unpatched"), None)
        if first is None:
            first = (model, "unpatched", [], 0)
        else:
            todo.remove(first)
        jobs += [first, *todo]
    return jobs


def run_all(args: argparse.Namespace, kept: Sequence[dict[str, Any]] = ()
            ) -> list[dict[str, Any]]:
    """Every process of `plan` in turn, each row marked with its round. The runs whose rows
    are in `kept` are not run again; their rows come first."""
    rows: list[dict[str, Any]] = list(kept)
    jobs = plan(args, {(r["model"], r["variant"], r.get("round", 0)) for r in kept})
    with tempfile.TemporaryDirectory(prefix="hf-models-") as ref_dir:
        for k, (model, variant, modes, turn) in enumerate(jobs, 1):
            start = time.perf_counter()
            reason = skip_reason(variant)
            if reason:
                done = [{"model": model, "variant": variant, "mode": m, "skipped": reason}
                        for m in modes]
            else:
                done = run_child(model, variant, modes, ref_dir, args)
                seconds = round(time.perf_counter() - start, 1)
                done = [{**r, "process_s": seconds} for r in done]
            done = [{**r, "round": turn} for r in done]
            rows += done
            label = f", round {turn + 1}/{args.rounds}" if args.rounds > 1 else ""
            print(f"[{k}/{len(jobs)}] {model} {variant}{label} "
                  f"({time.perf_counter() - start:.0f} s): {_progress(done)}",
                  file=sys.stderr, flush=True)
            if args.out:  # what a run stopped midway keeps: its rows so far
                write_json(f"{args.out}.partial", {"rows": rows}, indent=None)
    if args.out:
        Path(f"{args.out}.partial").unlink(missing_ok=True)
    return rows


# -------------------------------------------------------------------- table


def _rounds(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Each (model, mode, variant)'s rows, one a round (a later row of a round wins)."""
    by: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["model"], r["mode"], r["variant"]), {})[r.get("round", 0)] = r
    return {k: [v[n] for n in sorted(v)] for k, v in by.items()}


def _median_row(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A cell's rounds as one row: the median time of those timed (their logits ok only if
    every round's were), else the last round's skip or error."""
    timed = [r for r in rounds if "ms" in r]
    if not timed:
        return rounds[-1]
    return {**timed[0], "ms": statistics.median(r["ms"] for r in timed),
            "logits_ok": all(r.get("logits_ok", True) for r in timed)}


def _unrouted(row: dict[str, Any]) -> bool:
    """A patched variant that reached none of the model's norms (it ran transformers' code)."""
    return (row["variant"] != "unpatched" and row.get("norms", 0) > 0
            and row.get("norms_routed", 0) == 0)


def _cell(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if "skipped" in row:
        return "skipped"
    if "ms" not in row:
        return "error"
    if _unrouted(row):
        return "not routed"
    text = f"{row['ms']:.2f}"
    if base is not None and "ms" in base and row is not base:
        text += f" ({row['ms'] / base['ms']:.2f}x)"
    if not row.get("logits_ok", True):
        text += " !"
    return text


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One table row per model x mode, one column per variant: the time in ms (the median of
    its rounds) and its ratio to unpatched ("not routed" where a route reached none of the
    model's norms: what it timed is transformers' own code); then which cells are slower than
    unpatched by more than 2%, whose rounds spread by more than `SPREAD`, which logits differ
    from unpatched ("!"), which routes leave norms to transformers, and the errors."""
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    variants += sorted({r["variant"] for r in rows} - set(variants))
    keys = list(dict.fromkeys((r["model"], r["mode"]) for r in rows
                              if r["variant"] in variants))
    keys.sort(key=lambda k: (list(dict.fromkeys(r["model"] for r in rows)).index(k[0]),
                             MODES.index(k[1]) if k[1] in MODES else len(MODES)))
    rounds = _rounds(rows)
    at = {k: _median_row(v) for k, v in rounds.items()}
    lines = ["| model | mode | " + " | ".join(variants) + " |",
             "|---|---|" + "---:|" * len(variants)]
    slower, spread, differ, errors, unrouted = [], [], [], [], {}
    for model, mode in keys:
        base = at.get((model, mode, "unpatched"))
        cells = []
        for v in variants:
            row = at.get((model, mode, v))
            cells.append(_cell(row, base))
            if row is None:
                continue
            where = f"{model} {mode} {v}"
            each = rounds[(model, mode, v)]
            errors += [f"{where}: {r['error']}" for r in each if "error" in r]
            times = [r["ms"] for r in each if "ms" in r]
            if len(times) > 1 and max(times) > SPREAD * min(times):
                spread.append(f"{where} ({min(times):.2f}-{max(times):.2f})")
            if "ms" in row and not row.get("logits_ok", True):
                bad = next(r for r in each if "ms" in r and not r.get("logits_ok", True))
                differ.append(f"{where} ({bad.get('logits_rel_diff', 'not finite')})")
            if (v != "unpatched" and "ms" in row and base is not None and "ms" in base
                    and not _unrouted(row) and row["ms"] > SLOWER * base["ms"]):
                slower.append(f"{where} ({row['ms'] / base['ms']:.2f}x)")
            if (v != "unpatched" and "norms" in row
                    and row.get("norms_routed", 0) < row["norms"]):
                unrouted[f"{model} {v}"] = f"{row['norms_routed']}/{row['norms']}"
        lines.append(f"| {model} | {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Slower than unpatched by more than {SLOWER - 1:.0%}: " + (
        ", ".join(slower) if slower else "none") + ".")
    if spread:
        lines.append(f"Rounds apart by more than {SPREAD - 1:.0%} (fastest-slowest ms): "
                     + ", ".join(spread) + ".")
    if differ:
        lines.append(f"Logits differ from unpatched by more than {LOGITS_TOL} of their scale "
                     "(!): " + ", ".join(differ) + ".")
    if unrouted:
        lines.append("RMSNorm modules left to transformers' own code (routed/all): " + ", ".join(
            f"{k} {n}" for k, n in unrouted.items()) + ".")
    if errors:
        lines += ["", "Errors:", *(f"- {e}" for e in errors)]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------- child


def model_config(name: str, tiny: bool, layers: int) -> tuple[str, dict[str, Any]]:
    """(model_type, config arguments) of a model of `MODELS`, or of its tiny version."""
    model_type, sizes = MODELS[name]
    if tiny:
        sizes = {**{k: v for k, v in sizes.items() if k in TINY_KEEPS}, **TINY}
        if model_type == "gemma3_text":
            sizes["query_pre_attn_scalar"] = TINY["head_dim"]
        layers = 1
    return model_type, {**sizes, "num_hidden_layers": layers}


def liger_options(fn: Callable[..., Any]) -> dict[str, bool]:
    """Liger's patch arguments: rms_norm on, every other kernel it offers off."""
    return {name: name == "rms_norm" for name, p in inspect.signature(fn).parameters.items()
            if isinstance(p.default, bool)}


def apply_liger(model_type: str) -> dict[str, bool]:
    import liger_kernel.transformers as lt

    fn = getattr(lt, LIGER[model_type])
    options = liger_options(fn)
    fn(**options)
    return options


def _norm_mean(model_type: str) -> float:
    """Where the model's norm weights start: 0 where the scale is 1 + w (Gemma's), else 1."""
    return 0.0 if model_type.startswith("gemma") else 1.0


def init_weights(model: Any, model_type: str, std: float, seed: int = 0) -> None:
    """Draw every parameter from a generator seeded by its name (norm weights around their
    init, with `NORM_STD`; the rest around 0 with `std`), so the weights are the same whatever
    classes the variant built and whatever they drew from the global RNG."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator(device=p.device).manual_seed(seed + zlib.crc32(name.encode()))
            if "norm" in name:
                p.normal_(_norm_mean(model_type), NORM_STD, generator=g)
            else:
                p.normal_(0.0, std, generator=g)


def _forward_module(module: Any) -> str:
    forward = module.forward
    return getattr(getattr(forward, "__func__", forward), "__module__", "") or ""


def routing(model: Any) -> dict[str, int]:
    """How many RMSNorm modules the model has, how many run kerneltune's or Liger's code, and
    how many decoder layers add their residuals in kerneltune's fused kernel."""
    from kerneltune.runtime.fusion import is_fused_class

    norms = [m for m in model.modules() if "rmsnorm" in type(m).__name__.lower()]
    routed = sum(_forward_module(m).startswith(("kerneltune", "liger_kernel")) for m in norms)
    fused = sum(is_fused_class(type(m)) for m in model.modules())
    return {"norms": len(norms), "norms_routed": routed,
            **({"layers_fused": fused} if fused else {})}


def build(variant: str, model_type: str, config: dict[str, Any], device: str) -> tuple[Any, dict]:
    """The model of `variant` on `device`, in eval mode, and what the variant says of it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import kerneltune

    extra: dict[str, Any] = {}
    if variant in ("patch_transformers", "fuse_residuals"):
        kerneltune.patch_transformers([model_type], fuse_residuals=variant == "fuse_residuals")
    elif variant == "liger":
        extra["liger_options"] = apply_liger(model_type)
    cfg = AutoConfig.for_model(model_type, **config)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    init_weights(model, model_type, getattr(cfg, "initializer_range", 0.02))
    model.eval()
    if variant.startswith("patch_model"):
        kerneltune.patch_model(model)
    return model, extra


def kernelize_for(model: Any, variant: str, mode: str, device: str) -> None:
    """Bind the `kernels` layers for the mode about to run (the `kernelize` variant only)."""
    if variant != "kernelize":
        return
    from kernels import Mode, kernelize, use_kernel_mapping
    from kerneltune.layers import mapping

    kind = {"train_step": Mode.TRAINING,
            "prefill_compiled": Mode.INFERENCE | Mode.TORCH_COMPILE}.get(mode, Mode.INFERENCE)
    with use_kernel_mapping(mapping(device), inherit_mapping=False):
        kernelize(model, mode=kind, device=device)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], iters: int, warmup: int, device: str,
              before: Callable[[], Any] | None = None) -> float:
    """Median time of `fn` in ms over `iters` calls after `warmup`: CUDA events on a GPU, the
    wall clock elsewhere; `before` runs ahead of each call, outside the timing."""
    import torch

    for _ in range(warmup):
        if before:
            before()
        fn()
    _sync(device)
    times = []
    if device == "cuda":
        events = []
        for _ in range(iters):
            if before:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(iters):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def compare_logits(logits: Any, ref: Any | None) -> dict[str, Any]:
    """``logits_rel_diff`` (max abs difference over the largest abs reference logit) and
    ``logits_ok``; only finiteness where there is no reference."""
    import torch

    logits = logits.float().cpu()
    finite = bool(torch.isfinite(logits).all())
    if ref is None:
        return {"logits_ok": finite, "logits_check": "no unpatched reference"}
    ref = ref[-logits.shape[0]:]
    rel = float((logits - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    return {"logits_rel_diff": round(rel, 6) if finite else None,
            "logits_ok": finite and rel <= LOGITS_TOL}


class Run:
    """One child's model, its inputs and the runs of its modes."""

    def __init__(self, model: Any, variant: str, device: str, args: argparse.Namespace,
                 vocab: int, ref: Any | None):
        import torch

        self.model, self.variant, self.device, self.args, self.ref = (
            model, variant, device, args, ref)
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(vocab, (1, args.seq), generator=g).to(device)
        self.prompt = torch.randint(vocab, (args.batch, args.prompt), generator=g).to(device)
        self.step_ids = torch.randint(vocab, (args.batch, 1), generator=g).to(device)

    def time(self, fn: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
        return round(median_ms(fn, self.args.iters, self.args.warmup, self.device, before), 4)

    def check_logits(self) -> Any:
        """The eager logits of the last `CHECK_POSITIONS` positions of the prefill input."""
        import torch

        with torch.inference_mode():
            out = self.model(self.ids, logits_to_keep=CHECK_POSITIONS).logits[0]
        return out.float().cpu()

    def prefill(self) -> dict[str, Any]:
        import torch

        model = self.model
        with torch.inference_mode():
            return {"ms": self.time(lambda: model(self.ids, logits_to_keep=1))}

    def prefill_compiled(self) -> dict[str, Any]:
        import torch

        compiled = torch.compile(self.model)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = compiled(self.ids, logits_to_keep=1).logits[0]
            _sync(self.device)
            compile_s = round(time.perf_counter() - t0, 2)
            check = compare_logits(out, self.ref)
            ms = self.time(lambda: compiled(self.ids, logits_to_keep=1))
        return {"ms": ms, "compile_s": compile_s, **check}

    def decode(self) -> dict[str, Any]:
        import torch

        model, prompt = self.model, self.args.prompt
        name = kv_cache_name(model)
        with torch.inference_mode():
            cache = getattr(model(self.prompt, use_cache=True, logits_to_keep=1), name)

            def step() -> None:
                model(self.step_ids, use_cache=True, **{name: cache})

            return {"ms": self.time(step, lambda: crop_cache(cache, prompt))}

    def train_step(self) -> dict[str, Any]:
        model = self.model
        model.train()
        try:
            def step() -> None:
                model(self.ids, labels=self.ids).loss.backward()

            return {"ms": self.time(step, lambda: model.zero_grad(set_to_none=True))}
        finally:
            model.zero_grad(set_to_none=True)
            model.eval()


def kv_cache_name(model: Any) -> str:
    """What a transformers model calls its KV cache, as a forward argument and an output field:
    `cache` in the releases that deprecate `past_key_values`, `past_key_values` before them."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop_cache(cache: Any, length: int) -> None:
    """Cut a transformers cache back to its first `length` positions (a negative count removes
    that many from the end, in every transformers 5 release)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _error(e: BaseException) -> str:
    return traceback.format_exception_only(type(e), e)[-1].strip()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def child(name: str, variant: str, modes: Sequence[str], args: argparse.Namespace) -> None:
    """Build the model of (name, variant), check its logits against the unpatched model's
    (writing them, for unpatched), run each mode and print each row as a JSON line on stdout
    (everything else printed goes to stderr)."""
    rows_out, sys.stdout = sys.stdout, sys.stderr

    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row), file=rows_out, flush=True)

    import torch

    from kerneltune.env import device_name

    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = {"model": name, "variant": variant, "device": device_name()}
    model_type, config = model_config(name, args.tiny, args.layers)
    ref_path = Path(args.ref_dir) / f"{name}.pt"
    try:
        model, extra = build(variant, model_type, config, device)
        kernelize_for(model, variant, "prefill", device)
        base.update(routing(model), **extra)
        run = Run(model, variant, device, args, config["vocab_size"], None)
        logits = run.check_logits()
        if variant == "unpatched":
            torch.save(logits, ref_path)
        run.ref = torch.load(ref_path) if ref_path.exists() else None
        check = compare_logits(logits, run.ref)
    except Exception as e:  # the model cannot be built or run: each mode's row says why
        traceback.print_exc()
        for mode in modes:
            emit({**base, "mode": mode, "error": _error(e)})
        return
    for mode in modes:
        row: dict[str, Any] = {**base, "mode": mode, **check}
        _free(device)
        try:
            kernelize_for(model, variant, mode, device)
            row.update(getattr(run, mode)())
            if device == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        except Exception as e:
            traceback.print_exc()
            row["error"] = _error(e)
        emit(row)
    _free(device)


# -------------------------------------------------------------------- main


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    type=lambda s: _names(s, list(MODELS), "models"),
                    help=f"comma-separated, of {', '.join(MODELS)} "
                         f"(default: {', '.join(DEFAULT_MODELS)})")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    type=lambda s: _names(s, VARIANTS, "variants"),
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--modes", default=",".join(MODES),
                    type=lambda s: _names(s, MODES, "modes"),
                    help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of each model")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny models of the same types (for tests on the CPU)")
    ap.add_argument("--seq", type=int, default=2048, help="tokens of prefill and train_step")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before decode")
    ap.add_argument("--batch", type=int, default=8, help="sequences decoded together")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=_positive, default=1,
                    help="processes per (model, variant), a round at a time, each round's "
                         "order turned by one; a cell is the median of its rounds")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per process")
    ap.add_argument("--out", help="write the result here (JSON)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the (model, variant) runs that --out (or what a run stopped "
                         "midway left beside it) holds whole, and run the rest")
    ap.add_argument("--markdown", action="store_true", help="print the table")
    ap.add_argument("--md", help="write the table here")
    ap.add_argument("--table", nargs="+", metavar="RESULT",
                    help="run nothing: the table of results written before, their rows together "
                         "(with --out, one result of them all)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="show each process's stderr (else only where something failed)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "VARIANT", "MODES"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--ref-dir", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def merge(paths: Sequence[str]) -> dict[str, Any]:
    """One result of several written before (say, one per model, where a run must be split):
    the first one's device, environment and versions, every file's rows in order (a later row
    of the same model, variant, mode and round wins in the table), each file's arguments in
    "parts"."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    merged = {**results[0], "rows": [r for res in results for r in res["rows"]]}
    merged["models"] = {k: v for res in results for k, v in res.get("models", {}).items()}
    merged["wall_s"] = round(sum(res.get("wall_s") or 0.0 for res in results), 1)
    merged["parts"] = [{"file": Path(p).name, "device": res.get("device"), "args": res.get("args"),
                        "wall_s": res.get("wall_s")} for p, res in zip(paths, results, strict=True)]
    return merged


def write(result: dict[str, Any], args: argparse.Namespace, show: bool) -> None:
    """The result to --out, its table to --md, and printed with --markdown (or `show`)."""
    if args.out:
        write_json(args.out, result)
    table = markdown(result["rows"])
    if args.md:
        Path(args.md).write_text(table)
    if args.markdown or show:
        print(table, end="")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        name, variant, modes = args.child
        child(name, variant, [] if modes == "-" else modes.split(","), args)
        return
    if args.table:
        write(merge(args.table), args, show=not args.md)
        return
    start = time.perf_counter()
    rows = run_all(args, complete_runs(earlier_rows(args.out), args) if args.resume else ())
    # after the children: the parent never holds a CUDA context while they run
    from kerneltune.env import device_name, environment

    device = next((r["device"] for r in rows if "device" in r), None) or device_name()
    rows = [{**r, "device": r.get("device", device)} for r in rows]
    settings = {k: v for k, v in vars(args).items()
                if k not in ("child", "ref_dir", "table", "out", "md", "markdown", "verbose",
                             "resume")}
    write({
        "device": device,
        "env": dataclasses.asdict(environment()),
        "versions": versions(),
        "args": settings,
        "models": {n: {"model_type": t, **model_config(n, args.tiny, args.layers)[1]}
                   for n, (t, _) in MODELS.items() if n in args.models},
        "method": (f"median of {args.iters} calls after {args.warmup} warm-up calls, each "
                   f"(model, variant) in {args.rounds} fresh process(es), a round at a time; "
                   "bf16, random weights"),
        "logits_tol": LOGITS_TOL,
        "wall_s": round(time.perf_counter() - start, 1),
        "rows": rows,
    }, args, show=False)


if __name__ == "__main__":
    main()
