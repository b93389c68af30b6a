#!/usr/bin/env bash
# vLLM's own unit tests of the KV-cache and scheduler code, under the same
# coverage measurement as `python -m fuzz run --coverage` (fuzz/coverage/__init__.py),
# printing the same per-file / per-function tables (docs/coverage.md).
#
#   scripts/vllm-tests-coverage.sh [OUT_DIR] [pytest selection...]
#
# Default selection: tests/v1/core and the connector unit tests that build a
# scheduler (tests/v1/kv_connector/unit files using create_scheduler).
# Offline, CPU only: VLLM_TARGET_DEVICE=cpu, HF_HUB_OFFLINE=1, and a local
# HF_HOME holding a config.json for each model id the tests name.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VLLM_TESTS_VERSION:-0.33.0}
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-fuzz-out/vllm-tests-coverage}
shift || true
WORK=.cache/vllm-tests-$VERSION
installed=$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))')
if [ "$installed" != "$VERSION" ]; then
  echo "vllm-tests-coverage: the installed vLLM is $installed, the tests are $VERSION's" >&2
  exit 2
fi
# The sdist's tests/ tree, unpacked (never built): scripts/fetch_vllm_tests.py.
"$PY" scripts/fetch_vllm_tests.py "$VERSION" "$WORK"
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
export HF_HOME="$PWD/$WORK/hf" VLLM_CACHE_ROOT="$PWD/$WORK/vllm-cache"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ $# -eq 0 ]; then
  mapfile -t connector < <(cd "$WORK" && grep -l "create_scheduler\|Scheduler(" tests/v1/kv_connector/unit/test_*.py | sort)
  set -- tests/v1/core "${connector[@]}"
fi
exec nice -n 5 "$PY" scripts/vllm_tests_coverage.py "$WORK" "$OUT" "$@"
