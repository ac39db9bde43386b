#!/usr/bin/env bash
# Set up, then run a tuning job for this machine's GPU and export its table.
# On a machine without a GPU the job runs under the Triton interpreter on small shapes, labelled
# as the interpreter's (its timings are never filed under a GPU's name).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
KT=.venv/bin/kerneltune
mkdir -p out
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  gpus=$(.venv/bin/python -c "import torch; print(torch.cuda.device_count())")
  $KT tune --preset "${KERNELTUNE_PRESET:-llama3-8b}" --workers "${KERNELTUNE_WORKERS:-$gpus}" "$@"
  rows=2048
else
  export TRITON_INTERPRET=1
  $KT tune --kernel rmsnorm_fwd --kernel add_rmsnorm_fwd --n 1024 --n 4096 --m 1 --m 16 \
    --trials 6 "$@"
  rows=16
fi
$KT export --output out/table.json
echo "table written to out/table.json"
# The job refreshed this machine's own table: a new process resolves the tuned key exactly.
.venv/bin/python -c "import kerneltune; print(kerneltune.explain('rms_norm', ($rows, 4096, 'bfloat16')))"
