#!/usr/bin/env bash
# Set up (if needed) and run the fuzzer. With no arguments: `python -m fuzz run`,
# a short budget on the default targets (CPU, real vLLM 0.33.0).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
if [[ $# -eq 0 ]]; then set -- run; fi
exec "${FUZZ_VENV:-$root/.venv}/bin/python" -m fuzz "$@"
