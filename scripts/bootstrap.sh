#!/usr/bin/env bash
# Idempotent set-up of the lean CPU environment in .venv (or $FUZZ_VENV).
# A second run with unchanged requirements does nothing: the stamp file holds a
# hash of the requirement files that built the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FUZZ_VENV:-$root/.venv}"
python="${FUZZ_PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3

# vLLM's own tests tree (the sdist's tests/, unpacked, 2 s): the upstream-form
# tests run the known bugs' repros inside it (tests/known_bugs/upstream/).
tests_tree="$root/.cache/vllm-tests-0.33.0"
if [[ ! -d "$tests_tree/tests" ]]; then
  "$python" "$root/scripts/fetch_vllm_tests.py" 0.33.0 "$tests_tree" >&2 \
    || echo "bootstrap: note: could not fetch vLLM's tests tree; the upstream-form tests skip" >&2
fi

reqs=("$root/requirements/lean.txt" "$root/requirements/no-deps.txt" "$root/requirements/constraints.txt")
stamp_now="$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)"
if [[ -f "$venv/.fuzz-stamp" && "$(cat "$venv/.fuzz-stamp")" == "$stamp_now" ]]; then
  exit 0
fi

echo "bootstrap: building $venv (lean CPU install of vLLM 0.33.0)" >&2
start=$(date +%s)
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
source "$root/scripts/_torch-cpu-wheels.sh"
"${pip[@]}" "${torch_cpu_wheels[@]}" -c "$root/requirements/constraints.txt" -r "$root/requirements/lean.txt"
# --no-deps: see requirements/no-deps.txt for why.
"${pip[@]}" --no-deps -c "$root/requirements/constraints.txt" -r "$root/requirements/no-deps.txt"
"$venv/bin/python" -c "import vllm, vllm.v1.core.sched.scheduler; assert vllm.__version__ == '0.33.0', vllm.__version__"
torch_version="$("$venv/bin/python" -c 'import importlib.metadata as md; print(md.version("torch"))')"
if [[ "$torch_version" != *+cpu ]]; then
  # Works (the suite imports no CUDA code), but is the large CUDA build.
  echo "bootstrap: note: torch $torch_version is not the CPU build; set FUZZ_TORCH_CPU_WHEELS to get torch 2.13.0+cpu (README, Setup)" >&2
fi
echo "$stamp_now" > "$venv/.fuzz-stamp"
echo "bootstrap: done in $(( $(date +%s) - start ))s" >&2
