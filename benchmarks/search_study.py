"""How quickly the tuner's search finds a key's best config, against brute force.

Two steps, so the costly one runs once:

1. ``measure`` (on the GPU): every valid config of each key is timed the way the tuner times
   a candidate (fresh inputs checked against the reference, then graph replay over shared
   rotating inputs), with what each candidate cost in wall time (compile included).
2. ``picks`` (anywhere): each key's pick in a tuned table against the brute-force best, both as
   timed in the brute-force run.
3. ``replay`` (anywhere): the tuner's own search (`KeySearch`, the job's sampler, seeded with
   the default config) runs against those measurements instead of the GPU, for several seeds:
   trials and wall time until its best is within 2% of the brute-force best. Replaying the
   same measurements keeps timing noise out of the comparison between samplers.

    PYTHONPATH=src python benchmarks/search_study.py measure --keys rmsnorm_fwd:4096:2048 ... \
        --out brute.json
    PYTHONPATH=src python benchmarks/search_study.py picks brute.json --table table.json
    PYTHONPATH=src python benchmarks/search_study.py replay brute.json --out study.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import optuna

from kerneltune.env import device_name, environment, on_gpu
from kerneltune.kernels import KernelConfig, KernelSpec, Problem, get_spec
from kerneltune.table import Table
from kerneltune.table import load as load_table
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.precompile import Precompiler
from kerneltune.tuner.search import KeySearch, config_id
from kerneltune.tuner.timing import rotating_inputs, time_config
from kerneltune.tuner.worker import Outcome, problem_message

WITHIN = 0.02


def parse_key(text: str) -> tuple[str, int, int, str]:
    """'kernel:N:M[:dtype]'."""
    kernel, n, m, *rest = text.split(":")
    return kernel, int(n), int(m), rest[0] if rest else "bfloat16"


def measure(keys: list[str], budget_ms: float, precompile: int, path: Path) -> dict[str, Any]:
    """Time every valid config of each key, writing `path` after each key."""
    device = "cuda" if on_gpu() else "cpu"
    out: dict[str, Any] = {"device": device_name(), "env": environment().__dict__, "keys": {},
                           "precompile": precompile if device == "cuda" else 0}
    compiler = Precompiler(precompile) if device == "cuda" and precompile else None
    for text in keys:
        kernel, n, m, dtype = parse_key(text)
        spec = get_spec(kernel)
        problem = spec.problem(m, n, dtype)
        space = list(spec.configs(problem))
        # Compiling in parallel first, as the tuner does per batch; each config's cost then
        # carries its share of that wall time.
        t0 = time.perf_counter()
        if compiler is not None:
            compiler.compile(kernel, problem_message(problem), space)
        compile_share = (time.perf_counter() - t0) / max(1, len(space))
        sets = rotating_inputs(spec, problem, device=device) if device == "cuda" else None
        configs: dict[str, Any] = {}
        for i, config in enumerate(space):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"config": config.to_json()}
            try:
                inputs = spec.make_inputs(problem, seed=i + 1, device=device)
                why = spec.check(inputs, spec.run(inputs, config))
                if why:
                    row["error"] = why
                else:
                    row["us"] = time_config(spec, problem, config, device=device,
                                            input_sets=sets, budget_ms=budget_ms).median_us
            except Exception as e:  # a config that fails is part of the space's picture
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            row["cost_s"] = time.perf_counter() - t0 + compile_share
            configs[config_id(config)] = row
        ok = [r["us"] for r in configs.values() if "us" in r]
        out["keys"][text] = {"configs": configs, "best_us": min(ok) if ok else None,
                             "default": spec.default(problem).to_json()}
        print(f"{text}: {len(configs)} configs, best {min(ok) if ok else None} us, "
              f"{sum(r['cost_s'] for r in configs.values()):.0f} s", flush=True)
        del sets
        path.write_text(json.dumps(out, indent=1))
    if compiler is not None:
        compiler.close()
    return out


def picks(brute: dict[str, Any], table: Table) -> dict[str, Any]:
    """Per key of `brute`: the brute-force best, the table's pick and the default, each as timed
    there (µs), and the pick over the best; a pick the run did not time (another code's config)
    has no time."""
    index = table.index()
    out: dict[str, Any] = {}
    for text, data in brute["keys"].items():
        kernel, n, m, dtype = parse_key(text)
        entry = index.get((kernel, dtype, n, m))
        times = {config_id(r["config"]): r["us"] for r in data["configs"].values() if "us" in r}
        best = min(data["configs"].values(), key=lambda r: r.get("us", float("inf")))
        pick_us = times.get(config_id(entry.config)) if entry else None
        out[text] = {
            "valid_configs": len(times), "best_us": data["best_us"], "best": best["config"],
            "pick": entry and entry.config, "pick_trials": entry and entry.trials,
            "pick_us": pick_us, "default_us": times.get(config_id(data["default"])),
            "pick_over_best": pick_us / data["best_us"] if pick_us and data["best_us"] else None,
        }
        print(f"{text}: {len(times)} configs, best {_us(data['best_us'])}, pick {_us(pick_us)}, "
              f"default {_us(out[text]['default_us'])}", flush=True)
    return out


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} us"


class ReplayWorker:
    """Answers the search's candidates from the brute-force measurements (recorded configs read
    as the kernel's current code reads them: a parameter added since is at its old meaning, and
    candidates that use it otherwise were not measured)."""

    def __init__(self, configs: dict[str, Any], spec: KernelSpec, problem: Problem) -> None:
        self.configs = {config_id(spec.upgrade(problem, row["config"])): row
                        for row in configs.values()}
        self.cost_s = 0.0

    def evaluate(self, spec_ref: str, problem: Any, config: KernelConfig, **_: Any) -> Outcome:
        row = self.configs.get(config_id(config))
        if row is None:
            return Outcome("error", reason="not measured")
        self.cost_s += row["cost_s"]
        if "us" not in row:
            return Outcome("error", reason=row["error"])
        return Outcome("ok", median_us=row["us"], method="replay")


def replay(brute: dict[str, Any], seeds: list[int], sampler: str, cap: int, batch: int
           ) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, Any] = {}
    for text, data in brute["keys"].items():
        kernel, n, m, dtype = parse_key(text)
        spec, best = get_spec(kernel), data["best_us"]
        n_valid = len(data["configs"])
        brute_s = sum(r["cost_s"] for r in data["configs"].values())
        runs = []
        for seed in seeds:
            job = Job(kernels=[kernel], ns=[n], dtypes=[dtype], m_buckets=[m],
                      trials=min(cap, n_valid), sampler=sampler, seed=seed, batch=batch)
            key = TuneKey(brute["device"], kernel, dtype, n, m)
            worker = ReplayWorker(data["configs"], spec, spec.problem(m, n, dtype))
            curve: list[tuple[float, float]] = []  # (best so far / brute best, wall s)

            def on_trial(_key: TuneKey, _trial: Any, best_us: float | None,
                         worker: ReplayWorker = worker, curve: list = curve,
                         best: float = best) -> None:
                curve.append((best_us / best if best_us else float("inf"), worker.cost_s))

            search = KeySearch(job, key, spec, optuna.storages.InMemoryStorage(), worker,
                               on_trial=on_trial)
            search.search()
            hit = next((i for i, (ratio, _) in enumerate(curve) if ratio <= 1 + WITHIN), None)
            runs.append({"seed": seed, "curve": curve,
                         "trials_to_within": None if hit is None else hit + 1,
                         "wall_s_to_within": None if hit is None else curve[hit][1]})
        trials = [r["trials_to_within"] for r in runs]
        results[text] = {
            "valid_configs": n_valid, "brute_force_wall_s": brute_s, "best_us": best,
            "runs": runs,
            "median_fraction_of_space": statistics.median(
                (t if t is not None else float("inf")) / n_valid for t in trials),
        }
        print(f"{text}: {n_valid} configs; trials to within {WITHIN:.0%}: {trials}", flush=True)
    fractions = [r["median_fraction_of_space"] for r in results.values()]
    return {"device": brute["device"], "env": brute["env"], "sampler": sampler, "batch": batch,
            "within": WITHIN, "seeds": seeds, "keys": results,
            "median_fraction_of_space": statistics.median(fractions) if fractions else None}


def plot(study: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (text, data) in enumerate(study["keys"].items()):
        for run in data["runs"]:
            ys = [min(r, 2.0) for r, _ in run["curve"]]
            ax.plot(range(1, len(ys) + 1), ys, color=f"C{i % 10}", alpha=0.7, lw=1,
                    label=text if run is data["runs"][0] else None)
    ax.axhline(1 + study["within"], color="k", ls="--", lw=0.8, label="within 2% of brute force")
    ax.set(xlabel="trials", ylabel="best so far / brute-force best", xscale="log",
           title=f"{study['sampler']} search on {study['device']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--keys", nargs="+", required=True, help="kernel:N:M[:dtype]")
    m.add_argument("--budget-ms", type=float, default=15.0)
    m.add_argument("--precompile", type=int, default=12, help="compile processes (GPU)")
    m.add_argument("--out", required=True)
    p = sub.add_parser("picks")
    p.add_argument("brute")
    p.add_argument("--table", required=True, help="the tuned table whose picks to compare")
    p.add_argument("--out", default=None)
    r = sub.add_parser("replay")
    r.add_argument("brute", nargs="+", help="measure outputs (their keys are merged)")
    r.add_argument("--seeds", default="0,1,2")
    r.add_argument("--sampler", default="tpe")
    r.add_argument("--cap", type=int, default=300, help="most trials per search")
    r.add_argument("--batch", type=int, default=8, help="candidates asked at a time, as the "
                   "tuner asks them on a GPU")
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.step == "measure":
        measure(args.keys, args.budget_ms, args.precompile, Path(args.out))
        return
    if args.step == "picks":
        result = picks(json.loads(Path(args.brute).read_text()), load_table(args.table))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    brute = [json.loads(Path(p).read_text()) for p in args.brute]
    for other in brute[1:]:
        if other["device"] != brute[0]["device"]:
            raise SystemExit(f"measurements of {other['device']} and {brute[0]['device']}")
        brute[0]["keys"].update(other["keys"])
    study = replay(brute[0],
                   [int(s) for s in args.seeds.split(",")], args.sampler, args.cap, args.batch)
    out = Path(args.out)
    out.write_text(json.dumps(study, indent=1))
    plot(study, out.with_suffix(".png"))
    print(f"median fraction of the space to within {WITHIN:.0%}: "
          f"{study['median_fraction_of_space']}")


if __name__ == "__main__":
    main()
