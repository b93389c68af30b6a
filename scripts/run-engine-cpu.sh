#!/usr/bin/env bash
# Run the engine tier on CPU: set up .venv-engine-cpu if needed, then pytest the
# engine target and the engine self-tests in it. Extra arguments go to pytest.
#   ENGINE_EXAMPLES=N      Hypothesis examples for the engine target (default 40)
#   HYPOTHESIS_PROFILE     dev/ci/nightly/fuzz (default ci: derandomized)
#   KVTRUNC_ENGINE_REPORT  write the run's figures (examples/s, start-up s, outcomes) as JSON
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-engine-cpu.sh"
cd "$root"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
export KVTRUNC_ENGINE_EXAMPLES="${ENGINE_EXAMPLES:-40}"
export KVTRUNC_ENGINE_REPORT="${KVTRUNC_ENGINE_REPORT:-$root/.cache/engine/last-run.json}"
mkdir -p "$(dirname "$KVTRUNC_ENGINE_REPORT")"
# One process: the engine and its cold reference are built once per session.
rc=0
"${ENGINE_CPU_VENV:-$root/.venv-engine-cpu}/bin/python" -m pytest -p no:xdist \
  fuzz/targets/target_engine.py tests/test_engine_tier.py "$@" || rc=$?
[[ -f "$KVTRUNC_ENGINE_REPORT" ]] && cat "$KVTRUNC_ENGINE_REPORT"
exit $rc
