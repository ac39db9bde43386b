"""The backward's whole rows in parts, from the store of runs 45-48: per key whose N is no
power of two (the keys of runs 45 and 47), the fastest config of its search in one block and in
parts.

    PYTHONPATH=src python summarize.py h200.db.xz parts.json parts.png
"""

from __future__ import annotations

import json
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import optuna

from kerneltune.tuner.job import TuneKey, read_keys
from kerneltune.tuner.search import study_name

HERE = Path(__file__).parent
#: The kernel hash of the backward with PARTS (`parts.patch` applied to commit 7798c4a).
CODE = "55b62e2c7f7f9d0d"
DEVICE = "NVIDIA H200"


def fastest(trials: list[optuna.trial.FrozenTrial]) -> dict | None:
    best = min(trials, key=lambda t: t.value, default=None)
    return None if best is None else {"us": best.value, "config": best.params}


def main() -> None:
    store, out_json, out_png = map(Path, sys.argv[1:4])
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        with lzma.open(store) as src, db.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
        rows = []
        keys = [key for run in ("keys-parts-suite.json", "keys-parts-rest.json")
                for key in read_keys((HERE / run).read_text())]
        for kernel, dtype, n, m in keys:
            study = optuna.load_study(study_name=study_name(TuneKey(DEVICE, kernel, dtype, n, m),
                                                            CODE), storage=storage)
            done = [t for t in study.trials if t.value is not None]
            one = fastest([t for t in done if t.params.get("PARTS", 1) == 1])
            parts = fastest([t for t in done if t.params.get("PARTS", 1) > 1])
            rows.append({"n": n, "m": m, "trials": len(done), "one_block": one, "parts": parts,
                         "one_over_parts": one["us"] / parts["us"] if one and parts else None})
    rows.sort(key=lambda r: (r["n"], r["m"]))
    out_json.write_text(json.dumps({"device": DEVICE, "code": CODE, "keys": rows}, indent=1))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for n in sorted({r["n"] for r in rows}):
        mine = [r for r in rows if r["n"] == n and r["one_over_parts"]]
        ax.plot([r["m"] for r in mine], [r["one_over_parts"] for r in mine], "o-", label=f"N={n}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (rows)")
    ax.set_ylabel("fastest one block / fastest in parts (search time)")
    ax.set_title("rmsnorm_bwd on an H200, bf16: a whole row in power-of-two parts (> 1: parts win)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


if __name__ == "__main__":
    main()
