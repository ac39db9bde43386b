#!/usr/bin/env bash
# The whole shape suite in one run on one host: one `bench_kernels.py` process per GPU, each
# measuring its shard (and its own GPU's copy bandwidth) beside the peers.
#
#   benchmarks/suite_on_gpus.sh OUT_DIR TABLE [SECONDS [KERNELS]]
#
# OUT_DIR receives shard-I.json and shard-I.log per GPU; TABLE is the tuned table to run.
# SECONDS bounds the run: a shard stopped by it keeps every shape it finished, and the same
# command resumes it. KERNELS (comma-separated, default all four) narrows the suite to the
# kernels a change touched. Merge the shards with merge_bench.py.
set -uo pipefail
out=$1 table=$2 seconds=${3:-0}
kernels=${4:-rmsnorm_fwd,rmsnorm_bwd,add_rmsnorm_fwd,rmsnorm_quant_fwd}
here=$(dirname "$0")
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
[ "$gpus" -gt 0 ] || { echo "suite_on_gpus.sh: no GPU found (nvidia-smi --list-gpus)" >&2; exit 1; }
mkdir -p "$out"
pids=()
for ((i = 0; i < gpus; i++)); do
  CUDA_VISIBLE_DEVICES=$i timeout "$seconds" python3 "$here/bench_kernels.py" \
    --kernels "$kernels" --quant int8,fp8 \
    --dtype bfloat16 --table "$table" --shard "$i/$gpus" --resume \
    --out "$out/shard-$i.json" >> "$out/shard-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
