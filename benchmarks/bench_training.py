"""A training step's norm through autograd (forward, then the gradients of x and the weight),
eagerly and in a CUDA graph, for kerneltune's public functions beside torch and Liger, in one
process on a GPU. Each implementation's output and gradients are checked against float64
autograd first.

Eager time per step is what a model trained without CUDA graphs waits for where the host is
the bottleneck: best of 5 x up to 2000 back-to-back steps (`kerneltune.runtime.bench`). GPU
time is the same step replayed from a CUDA graph over rotating inputs (> 4x the L2), median.

    PYTHONPATH=src:benchmarks python benchmarks/bench_training.py --label new --out train.json
    python benchmarks/bench_training.py --plot train.json [before.json ...] --out training.png
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import kerneltune
from kerneltune.env import device_name, environment
from kerneltune.runtime.bench import per_call_us
from kerneltune.tuner.timing import graph_time, rotation_count
from peers import add_rmsnorm_formula, compiled, hf_rmsnorm

EPS = 1e-6
#: Leaves, then outputs -> the tensors whose gradients a step takes.
Norm = Callable[..., tuple[torch.Tensor, ...]]


def _norms() -> dict[str, Norm]:
    out: dict[str, Norm] = {
        "kerneltune": lambda x, w: (kerneltune.rms_norm(x, w, EPS),),
        "torch-eager": lambda x, w: (hf_rmsnorm(x, w, EPS),),
        "F.rms_norm": lambda x, w: (F.rms_norm(x, (x.shape[-1],), w, EPS),),
    }
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return out
    # Not in place: its backward would otherwise overwrite the step's dy.
    out["liger"] = lambda x, w: (LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False),)
    return out


def _add_norms() -> dict[str, Norm]:
    out: dict[str, Norm] = {
        "kerneltune": lambda x, r, w: kerneltune.add_rms_norm(x, r, w, EPS),
        "torch-eager": lambda x, r, w: add_rmsnorm_formula(x, r, w, EPS)[:2],
    }
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        return out
    out["liger"] = lambda x, r, w: LigerFusedAddRMSNormFunction.apply(
        x, r, w, EPS, 0.0, "llama", False)
    return out


def _compiled(fn: Callable[..., Any], n_out: int) -> Norm:
    step = compiled(fn)()
    return (lambda x, w: (step(x, w, EPS),)) if n_out == 1 else (
        lambda x, r, w: step(x, r, w, EPS)[:2])


def _leaves(m: int, n: int, add: bool, seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(m, n), (m, n), (n,)] if add else [(m, n), (n,)]
    leaves = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes]
    leaves[-1] = 1 + 0.1 * leaves[-1]
    return [t.requires_grad_() for t in leaves]


def _step(fn: Norm, leaves: list[torch.Tensor], grads: list[torch.Tensor]
          ) -> Callable[[], tuple[torch.Tensor, ...]]:
    def step() -> tuple[torch.Tensor, ...]:
        outs = fn(*leaves)
        return (*outs, *torch.autograd.grad(outs, leaves, grads[:len(outs)]))

    return step


def _reference(add: bool, leaves: list[torch.Tensor], grads: list[torch.Tensor]
               ) -> tuple[torch.Tensor, ...]:
    ref = [t.detach().double().requires_grad_() for t in leaves]
    s = ref[0] + ref[1] if add else ref[0]
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * ref[-1]
    outs = (y, s) if add else (y,)
    return (*outs, *torch.autograd.grad(outs, ref, [g.double() for g in grads[:len(outs)]]))


def _error(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> float:
    """The largest relative error (Frobenius) over the outputs and gradients."""
    return max(float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
               for a, b in zip(got, want, strict=True))


def measure(kernel: str, name: str, fn: Norm, m: int, n: int) -> dict[str, Any]:
    add = kernel == "add_rms_norm"
    sets = rotation_count((5 if add else 3) * m * n * 2)
    inputs = [_leaves(m, n, add, seed) for seed in range(sets)]
    grads = [[torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
             for _ in range(sets)]
    steps = [_step(fn, leaves, g) for leaves, g in zip(inputs, grads, strict=True)]
    row: dict[str, Any] = {"kernel": kernel, "m": m, "n": n, "impl": name}
    try:
        row["rel_err"] = _error(steps[0](), _reference(add, inputs[0], grads[0]))
        if row["rel_err"] > 2e-2:
            row["error"] = "wrong output"
            return row
        row["gpu_us"] = graph_time(lambda i: steps[i](), sets).median_us
        n_calls = int(min(2000, max(20, 0.2 / max(row["gpu_us"] * 1e-6, 1e-6))))
        row["eager_us"] = per_call_us(steps[0], calls=n_calls, repeats=5)
    except Exception as e:  # a peer that cannot run a shape is reported, not fatal
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        torch.cuda.synchronize()
    return row


def plot(paths: list[str], out: str) -> None:
    """Eager and GPU µs per step against M at N = 4096, a panel per function, a colour per
    implementation: every implementation of the first file, kerneltune's of the others (each
    labelled by its file's label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(Path(p).read_text()) for p in paths]
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i, result in enumerate(results):
        for r in result["rows"]:
            if r["n"] != 4096 or "eager_us" not in r or (i and r["impl"] != "kerneltune"):
                continue
            name = r["impl"] if r["impl"] != "kerneltune" else f"kerneltune ({r['label']})"
            lines.setdefault((r["kernel"], name), []).append(r)
    colors = {name: f"C{i}" for i, name in enumerate(sorted({name for _, name in lines}))}
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), sharey=True)
    for ax, kernel in zip(axes, ("rms_norm", "add_rms_norm"), strict=True):
        for (k, name), rows in sorted(lines.items()):
            if k != kernel:
                continue
            rows.sort(key=lambda r: r["m"])
            ms = [r["m"] for r in rows]
            ax.plot(ms, [r["eager_us"] for r in rows], "o-", color=colors[name],
                    label=f"{name}, eager")
            ax.plot(ms, [r["gpu_us"] for r in rows], "x:", color=colors[name],
                    label=f"{name}, GPU")
        ax.set(xscale="log", yscale="log", xlabel="M (rows), N = 4096",
               title=f"{kernel}: forward + backward, µs per step")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per step (eager: solid; GPU, in a CUDA graph: dotted)")
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend([handles[k] for k in sorted(handles)], sorted(handles), fontsize=7,
               loc="center left", bbox_to_anchor=(0.8, 0.5))
    device, env = results[0]["device"], results[0]["env"]
    fig.suptitle(f"{device}, torch {env['torch']}, Triton {env['triton']}")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", nargs="+", metavar="RESULT", help="draw result files to --out")
    ap.add_argument("--label", default="", help="what this process's kerneltune is")
    ap.add_argument("--shapes", default="1x4096,64x4096,512x4096,2048x4096,8192x4096,2048x8192")
    ap.add_argument("--impls", default="", help="comma-separated names to run (default: all)")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.out)
        return
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    wanted = set(filter(None, args.impls.split(",")))
    rows = []
    for kernel, impls, formula, n_out in (("rms_norm", _norms, hf_rmsnorm, 1),
                                          ("add_rms_norm", _add_norms, add_rmsnorm_formula, 2)):
        for m, n in shapes:
            named = impls()
            if not wanted or "torch.compile" in wanted:
                named["torch.compile"] = _compiled(formula, n_out)  # afresh per shape
            for name, fn in named.items():
                if wanted and name not in wanted:
                    continue
                row = {**measure(kernel, name, fn, m, n), "label": args.label}
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {"device": device_name(), "env": environment().__dict__,
              "kerneltune": kerneltune.__file__, "label": args.label,
              "method": "eager: best of 5 x up to 2000 back-to-back steps (forward, then "
                        "torch.autograd.grad of x and the weight); gpu: CUDA-graph replay of "
                        "the step over rotating inputs (> 4x L2), median",
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
