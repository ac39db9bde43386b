#!/usr/bin/env bash
# One tuning job on two GPUs of one host against one worker on the same job, then a longer
# two-worker job into the table's store, with GPU utilisation sampled throughout.
#
#   benchmarks/two_gpu_run.sh OUT_DIR STORE_URL SECONDS
#
# OUT_DIR receives the logs, the comparison's stores and nvidia-smi samples; STORE_URL is the
# store the long job resumes and fills; SECONDS bounds the long job (it resumes next time).
set -uo pipefail
out=$1 store=$2 budget=$3
kt() { python3 -m kerneltune.cli tune --no-progress --trials 8 --retime-rounds 3 "$@"; }
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader \
  -lms 500 > "$out/smi.csv" &
smi=$!
mark() { echo "$(date +%s.%N) $1" >> "$out/phases.txt"; }

# The comparison: the same 8 keys, each run with a cold compile cache and its own store.
compare=(-k rmsnorm_fwd -k add_rmsnorm_fwd --n 4096 -m 1 -m 64 -m 1024 -m 16384)
for w in 1 2; do
  mark "compare-workers-$w start"
  TRITON_CACHE_DIR="/tmp/triton-cache-$w" kt "${compare[@]}" --workers "$w" \
    --db "sqlite:///$out/compare-$w.db" > "$out/compare-$w.log" 2>&1
  mark "compare-workers-$w end"
done

mark "table start"
kt --workers 2 --db "$store" --time-budget "$budget" -k rmsnorm_fwd -k add_rmsnorm_fwd \
  -k rmsnorm_quant_fwd -k rmsnorm_bwd --n 4096 > "$out/table.log" 2>&1
mark "table end"
kill "$smi"
