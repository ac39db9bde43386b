"""Re-tune an explicit list of keys of a store, each search resumed for more trials, so
that its seeds (the fastest configs of the key's searches on earlier kernel code among them)
are measured on the running code; then report each key's pick before and after.

    python retune.py STORE.db KEYS.json OUT.json --device NAME [--extra 3] [--workers 1]

KEYS.json: [{"kernel", "n", "m"[, "dtype"]}...] (dtype: bfloat16 unless given). A key's
study resumes with its measured trials + extra as budget (keys grouped by that budget, one job
each; --workers: tuning lanes, one a visible GPU)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from kerneltune import storage
from kerneltune.kernels import REGISTRY
from kerneltune.tuner.job import Job, TuneKey
from kerneltune.tuner.runner import JobRunner, open_stores
from kerneltune.tuner.search import done_info, measured, study_name


@dataclass
class KeysJob(Job):
    """A job over exactly `only` ((kernel, dtype, n, m)), not a cross product."""

    only: list = field(default_factory=list)

    def keys(self, device: str) -> list[TuneKey]:
        return sorted(TuneKey(device, k, d, n, m, k) for k, d, n, m in self.only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("keys")
    ap.add_argument("out")
    ap.add_argument("--device", required=True, help="the GPU's name, as the store has it")
    ap.add_argument("--extra", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    url = f"sqlite:///{args.store}"
    engine, studies = open_stores(url)
    Session = storage.session_factory(engine)
    device = args.device
    groups: dict[int, list] = defaultdict(list)
    before = {}
    for item in json.loads(Path(args.keys).read_text()):
        k, d, n, m = item["kernel"], item.get("dtype", "bfloat16"), item["n"], item["m"]
        key = TuneKey(device, k, d, n, m, k)
        study = optuna.load_study(study_name=study_name(key, REGISTRY[k].kernel_hash),
                                  storage=studies)
        count = len(measured(study.get_trials(deepcopy=False)))
        groups[count + args.extra].append((k, d, n, m))
        with Session() as s:
            row = storage.get_result(s, device, k, d, n, m)
            before[(k, d, n, m)] = {"config": dict(row.config), "us": row.us, "trials": count}
    engine.dispose()
    for trials, only in sorted(groups.items()):
        job = KeysJob(kernels=sorted({k for k, *_ in only}), ns=[n for *_, n, _ in only],
                      dtypes=sorted({d for _, d, *_ in only}), only=only, trials=trials,
                      retime_rounds=2, timing_ms=25.0, precompile=8, batch=4)
        report = JobRunner(job, url, workers=args.workers).run()
        print(f"{len(only)} keys to {trials} trials: {report.status}", flush=True)
    engine, studies = open_stores(url)
    Session = storage.session_factory(engine)
    rows = []
    for (k, d, n, m), b in before.items():
        key = TuneKey(device, k, d, n, m, k)
        with Session() as s:
            row = storage.get_result(s, device, k, d, n, m)
        done = done_info(studies, study_name(key, REGISTRY[k].kernel_hash)) or {}
        rows.append({"kernel": k, "dtype": d, "n": n, "m": m, "before": b,
                     "after": {"config": dict(row.config), "us": row.us},
                     "changed": dict(row.config) != b["config"],
                     "finalists": done.get("finalists")})
        print(f"{k} {d} {m}x{n}: {b['us']:.2f} -> {row.us:.2f} us"
              f"{' (new pick)' if rows[-1]['changed'] else ''}", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
