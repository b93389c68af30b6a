"""The process environment vLLM needs here, vLLM's version, and its hash seed.

Imported first by every adapter module: vLLM reads these variables when it
is imported, and it must never reach for the hub or write under ``$HOME``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
_CACHE_ROOT = os.path.join(tempfile.gettempdir(), "kvtrunc-fuzz-cache")
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(_CACHE_ROOT, "vllm"))
os.environ.setdefault("HF_HOME", os.path.join(_CACHE_ROOT, "hf"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

with warnings.catch_warnings():
    # A vLLM source checkout that was never built has no vllm/_version.py
    # (setuptools-scm writes it at build time): vLLM warns and calls itself
    # "dev". That is expected for --vllm-src, not an error.
    warnings.filterwarnings("ignore", "Failed to read commit hash", RuntimeWarning)
    import vllm  # noqa: E402

from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils as _kcu  # noqa: E402

__all__ = ["VLLM_ROOT", "VLLM_VERSION", "init_hashing", "sha256"]

# The directory holding the ``vllm`` package (frames under it are vLLM's).
VLLM_ROOT = os.path.dirname(os.path.abspath(vllm.__file__))


def _vllm_version() -> str:
    """vLLM's version; for an unbuilt source checkout, "dev" plus where it is
    and, in a git clone, the commit (``git describe``)."""
    if vllm.__version__ != "dev":
        return vllm.__version__
    root = os.path.dirname(VLLM_ROOT)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        described = subprocess.run(
            ["git", "-C", root, "describe", "--tags", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        if described:
            return f"dev {described} (source checkout {root})"
    return f"dev (source checkout {root})"


VLLM_VERSION: str = _vllm_version()
_hashing_ready = False


def init_hashing() -> None:
    """Initialise vLLM's block-hash seed once per process (vLLM's tests do the same)."""
    global _hashing_ready
    if not _hashing_ready:
        _kcu.init_none_hash(sha256)
        _hashing_ready = True
