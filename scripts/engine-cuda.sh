#!/usr/bin/env bash
# The engine tier on one CUDA GPU, install included, in under 8 minutes.
# Not yet run on a GPU: its first run there is still to come.
#
# Environment, first found wins:
#   1. $ENGINE_CUDA_PYTHON: a python that already imports vllm 0.33.0 with CUDA;
#   2. .venv-engine-cuda (or $ENGINE_CUDA_VENV) from an earlier run of this script;
#   3. a fresh venv: `pip install vllm==0.33.0` (about 9.4 GB; ~5 min where a
#      registry is reachable), from $ENGINE_WHEELHOUSE with --no-index when set
#      (a GPU host without network access needs the wheels placed there first).
# Where none can be had, or there is no GPU, it says why and exits 0 (a clean skip).
#
#   ENGINE_EXAMPLES   Hypothesis examples (default 200)
#   ENGINE_BUDGET_S   wall-clock budget for everything, install included (default 470)
#   OUT               if set, the figures JSON and the pytest log are written there
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
t0=$(date +%s)
budget="${ENGINE_BUDGET_S:-470}"
left() { echo $(( budget - ($(date +%s) - t0) )); }
skip() { echo "engine-cuda: SKIP: $*"; exit 0; }

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || skip "no NVIDIA GPU visible (nvidia-smi -L failed)"

has_engine() { "$1" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md, torch
assert md.version("vllm") == "0.33.0" and torch.cuda.is_available()
PY
}

py=""
venv="${ENGINE_CUDA_VENV:-$root/.venv-engine-cuda}"
if [[ -n "${ENGINE_CUDA_PYTHON:-}" ]] && has_engine "$ENGINE_CUDA_PYTHON"; then
  py="$ENGINE_CUDA_PYTHON"
elif [[ -x "$venv/bin/python" ]] && has_engine "$venv/bin/python"; then
  py="$venv/bin/python"
else
  base="$(command -v python3.11 || command -v python3 || true)"
  [[ -n "$base" ]] || skip "no python3 to build a venv with"
  "$base" -m venv "$venv" || skip "cannot create $venv"
  src=()
  if [[ -n "${ENGINE_WHEELHOUSE:-}" ]]; then src=(--no-index --find-links "$ENGINE_WHEELHOUSE"); fi
  echo "engine-cuda: installing vllm==0.33.0 into $venv (budget $(left)s)"
  if ! timeout $(( $(left) - 120 )) "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "${src[@]}" "vllm==0.33.0" hypothesis pytest; then
    skip "could not install vllm==0.33.0 (no registry reachable and no usable \$ENGINE_WHEELHOUSE)"
  fi
  has_engine "$venv/bin/python" || skip "vllm 0.33.0 installed but torch sees no CUDA device"
  py="$venv/bin/python"
fi
"$py" -c "import hypothesis, pytest" 2>/dev/null || "$py" -m pip install --quiet hypothesis pytest \
  || skip "hypothesis/pytest missing and not installable"
echo "engine-cuda: environment ready after $(( $(date +%s) - t0 ))s: $("$py" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))')"

out="${OUT:-$root/.cache/engine}"
mkdir -p "$out"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
export KVTRUNC_ENGINE_EXAMPLES="${ENGINE_EXAMPLES:-200}"
export KVTRUNC_ENGINE_REPORT="$out/engine-cuda.json"
remaining=$(left)
(( remaining > 60 )) || skip "only ${remaining}s of the budget left after set-up"
rc=0
timeout "$remaining" "$py" -m pytest -p no:xdist -q --hypothesis-show-statistics \
  fuzz/targets/target_engine.py tests/engine/test_engine_tier.py 2>&1 | tee "$out/engine-cuda-pytest.log" | tail -40
rc=${PIPESTATUS[0]}
[[ -f "$KVTRUNC_ENGINE_REPORT" ]] && cat "$KVTRUNC_ENGINE_REPORT"
echo "engine-cuda: pytest rc=$rc after $(( $(date +%s) - t0 ))s in all"
exit "$rc"
