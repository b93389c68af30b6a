# Sourced by bootstrap.sh and setup-engine-cpu.sh: where pip finds the CPU
# build of torch 2.13.0 (2.13.0+cpu). PyPI hosts only the CUDA build of
# torch 2.13.0, which pulls NVIDIA's CUDA wheels (see the README, Setup).
#
#   FUZZ_TORCH_CPU_WHEELS  a directory holding the wheel (given to pip as
#                          --find-links), or the URL of PyTorch's CPU wheel
#                          index (given as --extra-index-url).
#
# Unset: pip's own configuration decides (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL,
# pip.conf). Sets the array torch_cpu_wheels for pip's command line.
torch_cpu_wheels=()
if [[ -n "${FUZZ_TORCH_CPU_WHEELS:-}" ]]; then
  if [[ -d "$FUZZ_TORCH_CPU_WHEELS" ]]; then
    torch_cpu_wheels=(--find-links "$FUZZ_TORCH_CPU_WHEELS")
  else
    torch_cpu_wheels=(--extra-index-url "$FUZZ_TORCH_CPU_WHEELS")
  fi
fi
