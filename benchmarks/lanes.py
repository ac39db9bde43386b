"""Which worker lane (and GPU) tuned each key of a store, and when: the evidence that a
multi-GPU job kept its GPUs busy and split its keys without doing any twice.

Reads the "done" record the tuner leaves on each key's study (lane, GPU, start and end) and
writes a JSON summary and a timeline chart, one row per lane (and its GPU), one bar per key.

    python benchmarks/lanes.py STORE_URL --out lanes.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import optuna

from kerneltune.tuner.search import measured


def lanes(url: str) -> dict[str, Any]:
    storage = optuna.storages.RDBStorage(url)
    keys = []
    for study in optuna.get_all_study_summaries(storage, include_best_trial=False):
        done = study.user_attrs.get("done")
        if not done or not done.get("started"):
            continue
        trials = optuna.load_study(study_name=study.study_name, storage=storage).get_trials(
            deepcopy=False)
        kernel, dtype, n, m, kernel_hash = study.study_name.split(":")[2:]
        keys.append({"key": f"{kernel} {dtype} {n} {m}", "kernel_hash": kernel_hash,
                     "by": done["by"], "lane": done["by"].rpartition("/")[2],
                     "started": done["started"], "ended": done["at"],
                     "budget": done["budget"], "measured": len(measured(trials))})
    keys.sort(key=lambda k: k["started"])
    t0 = keys[0]["started"] if keys else 0.0
    busy: dict[str, float] = {}
    for k in keys:
        busy[k["lane"]] = busy.get(k["lane"], 0.0) + k["ended"] - k["started"]
    span = (max(k["ended"] for k in keys) - t0) if keys else 0.0
    return {
        "keys": [{**k, "started": k["started"] - t0, "ended": k["ended"] - t0} for k in keys],
        "span_s": span,
        "keys_per_lane": dict(Counter(k["lane"] for k in keys)),
        "busy_s_per_lane": busy,
        # A key tuned by two lanes would hold more measured trials than its budget.
        "keys_over_budget": [k["key"] for k in keys if k["measured"] > k["budget"]],
    }


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = sorted(summary["keys_per_lane"])
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(lanes)))
    kernels = sorted({k["key"].split()[0] for k in summary["keys"]})
    for k in summary["keys"]:
        row = lanes.index(k["lane"])
        colour = f"C{kernels.index(k['key'].split()[0]) % 10}"
        ax.barh(row, k["ended"] - k["started"], left=k["started"], color=colour,
                edgecolor="white", linewidth=0.5)
    for i, name in enumerate(kernels):
        ax.barh(-10, 0, color=f"C{i % 10}", label=name)  # legend entries only
    ax.set(yticks=range(len(lanes)), yticklabels=[f"lane {lane}" for lane in lanes],
           ylim=(-0.6, len(lanes) - 0.4), xlabel="seconds since the first key started",
           title=title)
    ax.legend(fontsize=7, loc="upper right", ncol=len(kernels))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="SQLAlchemy URL of the tuning store")
    ap.add_argument("--out", required=True, help="JSON to write (the chart beside it)")
    ap.add_argument("--title", default="keys tuned per worker lane")
    args = ap.parse_args()
    summary = lanes(args.store)
    out = Path(args.out)
    out.write_text(json.dumps(summary, indent=1))
    plot(summary, out.with_suffix(".png"), args.title)
    print(json.dumps({k: v for k, v in summary.items() if k != "keys"}))


if __name__ == "__main__":
    main()
