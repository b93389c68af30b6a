#!/usr/bin/env bash
# The lean tests under stress: both cores kept busy by another process and the
# tests in a shuffled order, so a test that depends on timing or on which test
# ran before it fails here (docs/stress.md).
#   STRESS_SEED   the order seed (default: drawn, printed first; rerun with it)
#   STRESS_BUSY   busy processes beside the tests (default: the core count)
# Arguments go to pytest (e.g. tests/tooling/test_cli.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
seed="${STRESS_SEED:-$(( (RANDOM << 15) | RANDOM ))}"
busy="${STRESS_BUSY:-$(nproc)}"
echo "stress-tests: order seed $seed (rerun: STRESS_SEED=$seed bash scripts/stress-tests.sh), $busy busy process(es)"
pids=()
cleanup() { (( ${#pids[@]} )) && kill "${pids[@]}" 2>/dev/null; true; }
trap cleanup EXIT
for _ in $(seq "$busy"); do
  python3 -c "while True: pass" &
  pids+=($!)
done
cd "$root"
rc=0
FUZZ_TEST_ORDER_SEED="$seed" HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" \
  "${FUZZ_VENV:-$root/.venv}/bin/python" -m pytest -p no:cacheprovider "$@" || rc=$?
echo "stress-tests: exit $rc with order seed $seed"
exit $rc
