#!/usr/bin/env bash
# Set up (if needed) and run the suite's own tests. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
bash "$root/scripts/ensure-redis.sh"  # for tests/test_redis_campaign.py; never fatal
cd "$root"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
exec "${FUZZ_VENV:-$root/.venv}/bin/python" -m pytest "$@"
