#!/usr/bin/env bash
# Run the engine tier on CPU: set up .venv-engine-cpu if needed, then pytest the
# engine target and the engine self-tests in it, and print the run's figures
# (the JSON report, then one summary line). Extra arguments go to pytest.
#   ENGINE_EXAMPLES=N      Hypothesis examples for the engine target (default 40)
#   HYPOTHESIS_PROFILE     dev/ci/nightly/fuzz (default ci: derandomized)
#   KVTRUNC_ENGINE_REPORT  where the figures JSON goes (default .cache/engine/last-run.json)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-engine-cpu.sh"
cd "$root"
py="${ENGINE_CPU_VENV:-$root/.venv-engine-cpu}/bin/python"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
export KVTRUNC_ENGINE_EXAMPLES="${ENGINE_EXAMPLES:-40}"
export KVTRUNC_ENGINE_REPORT="${KVTRUNC_ENGINE_REPORT:-$root/.cache/engine/last-run.json}"
mkdir -p "$(dirname "$KVTRUNC_ENGINE_REPORT")"
rm -f "$KVTRUNC_ENGINE_REPORT"  # an earlier run's figures must never pass for this one's
# One process: the engine and its cold reference are built once per pytest run.
rc=0
"$py" -m pytest -p no:xdist fuzz/targets/target_engine.py tests/engine/test_engine_tier.py "$@" || rc=$?
if [[ -f "$KVTRUNC_ENGINE_REPORT" ]]; then
  cat "$KVTRUNC_ENGINE_REPORT"; echo
  "$py" - "$KVTRUNC_ENGINE_REPORT" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
req = f["requests"]
total, match = sum(req.values()), req.get("match", 0)
others = ", ".join(f"{n} {s}" for s, n in sorted(req.items()) if s != "match")
print(
    f"engine tier: {f['examples']} examples, {f['examples_per_s']} examples/s, start-up {f['startup_s']} s; "
    f"{match} of {total} requests matched the cold run{f' ({others})' if others else ''}, "
    f"max logprob difference {f['max_logprob_diff']:.1e}; truncation branch {f['truncation_branch']}, "
    f"connector loads {f['loads']} ({f['failed_loads']} failed on purpose)"
)
PY
fi
exit $rc
