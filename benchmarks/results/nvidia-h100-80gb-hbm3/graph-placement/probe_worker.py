"""The tuner's worker against eager calls at four multi-GB problems (default configs): three
candidates each through `BenchmarkWorker.evaluate` (check, then graph timing), then the same
config's eager time per call in this process. Run from the repository root with `src` on the
path: `python3 probe_worker.py OUT.json`.
"""

import json
import sys

import torch

from kerneltune.kernels import REGISTRY
from kerneltune.runtime.bench import per_call_us
from kerneltune.tuner.worker import BenchmarkWorker, problem_message

cases = [("rmsnorm_fwd", 16384, 65536, {}), ("add_rmsnorm_fwd", 4096, 131072, {}),
         ("rmsnorm_bwd", 16384, 32768, {}), ("rmsnorm_quant_fwd", 4096, 262144, {"quant": "int8"})]
rows = []
with BenchmarkWorker(name="probe") as worker:
    for k, m, n, opts in cases:
        spec = REGISTRY[k]
        prob = spec.problem(m, n, "bfloat16", **opts)
        cfg = spec.default(prob)
        outs = [worker.evaluate(k, problem_message(prob), cfg, seed=s, compile_timeout_s=300,
                                run_timeout_s=120, timing_ms=25) for s in (1, 2, 3)]
        inputs = spec.make_inputs(prob, 0, "cuda")
        eager = per_call_us(spec.run, inputs, cfg, calls=50, repeats=3)
        del inputs
        torch.cuda.empty_cache()
        r = {"kernel": k, "m": m, "n": n, "eager_us": eager,
             "worker_us": [o.median_us if o.ok else o.reason for o in outs]}
        print(json.dumps(r), flush=True)
        rows.append(r)
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=1)
