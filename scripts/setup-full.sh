#!/usr/bin/env bash
# The GPU path: vLLM 0.33.0 with all of its declared dependencies (CUDA torch
# 2.14.0, GPU kernels; about 9.4 GB, ~5 minutes) in .venv-full, plus the suite's
# own packages. Use it with: FUZZ_VENV=.venv-full bash scripts/run-tests.sh
# (the suite itself runs the same on either environment).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FUZZ_VENV_FULL:-$root/.venv-full}"
python="${FUZZ_PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
# A constraint file set for pip (PIP_CONSTRAINT, or pip's own configuration)
# may refuse vLLM's torch pin; the full install wants exactly vLLM's declared
# versions, so this one command runs without it.
PIP_CONSTRAINT= "$venv/bin/pip" install --quiet "vllm==0.33.0" hypothesis pytest pytest-xdist
"$venv/bin/python" -c "import vllm; assert vllm.__version__ == '0.33.0'"
# run-tests.sh / run-fuzz.sh skip their lean bootstrap when this stamp matches.
cat "$root/requirements/lean.txt" "$root/requirements/no-deps.txt" "$root/requirements/constraints.txt" | sha256sum | cut -d' ' -f1 > "$venv/.fuzz-stamp"
echo "full install ready in $venv"
