"""The forward's configs that a search timed both ways, released after the loads and as the
program exits (LATE_RELEASE), in the same search (one process, one GPU): per key and config,
the early release's time over the late one's (> 1: the late release is faster). Search
timings, one measurement each; the picks were re-timed beside each other.

    xz -dk benchmarks/results/nvidia-h200/store/h200.db.xz
    python release_pairs.py sqlite:///.../h200.db f15b0b049ba097a0 release-pairs.json
"""

from __future__ import annotations

import collections
import json
import sys

import optuna
from optuna.trial import TrialState


def main(url: str, kernel_hash: str, out: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pairs = []
    for summary in optuna.get_all_study_summaries(url):
        name = summary.study_name
        if ":rmsnorm_fwd:" not in name or not name.endswith(kernel_hash):
            continue
        dtype, n, m = name.split(":")[3:6]
        timed: dict[str, dict[bool, float]] = {}
        study = optuna.load_study(study_name=name, storage=url)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            config = dict(trial.params)
            late = bool(config.pop("LATE_RELEASE", False))
            timed.setdefault(json.dumps(config, sort_keys=True), {})[late] = trial.value
        for config, times in timed.items():
            if len(times) == 2:
                pairs.append({"dtype": dtype, "m": int(m[1:]), "n": int(n[1:]),
                              "early_over_late": round(times[False] / times[True], 4),
                              "config": json.loads(config)})
    pairs.sort(key=lambda p: (p["dtype"], p["m"], p["n"]))
    by_rows = collections.defaultdict(list)
    for p in pairs:
        by_rows[(p["dtype"], p["m"])].append(p["early_over_late"])
    for (dtype, m), ratios in sorted(by_rows.items()):
        ratios.sort()
        print(f"{dtype:9} M={m:6}  {len(ratios):3} configs  early/late: min {ratios[0]:.3f}  "
              f"median {ratios[len(ratios) // 2]:.3f}  max {ratios[-1]:.3f}")
    with open(out, "w") as fh:
        json.dump(pairs, fh, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
