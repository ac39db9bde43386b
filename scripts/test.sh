#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run it (no GPU needed:
# Triton kernels run under its CPU interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser test drives Debian's chromium; the compose file is validated by docker-compose.
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
export TRITON_INTERPRET=1
# Two worker processes (each test has its own data directory, SQLite file and PostgreSQL
# database, so they share nothing): the suite takes about 60% of its serial time on two cores.
# A later -n overrides it (-n 0: one process).
exec .venv/bin/python -m pytest -n 2 "$@"
