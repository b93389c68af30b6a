"""Side-by-side installs of other vLLM releases, for running the suite against them.

Each release is installed with ``pip install --no-deps --target ROOT/VERSION
vllm==VERSION`` (about 10 s and 0.8 GB each from PyPI).  A subprocess then runs
the base interpreter with that directory first on ``PYTHONPATH``, so the
release's ``vllm`` package shadows the one in the base venv while torch and the
pure-Python dependencies come from the base venv.  Releases 0.27.0 to 0.32.0
import and drive ``KVCacheManager`` and ``Scheduler`` this way with no extra
dependency (see docs/vllm-versions.md).

Typical use::

    path = ensure_vllm_env("0.28.0", DEFAULT_ROOT)
    subprocess.run([sys.executable, "probe.py"], env=python_env_for(path))
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "DEFAULT_ROOT",
    "cache_env",
    "MARKER",
    "ensure_vllm_env",
    "installed_version",
    "is_release_version",
    "python_env_for",
]

#: Default install root: ``<repo>/.cache/vllm-envs`` (ignored by git).
DEFAULT_ROOT: Path = Path(__file__).resolve().parents[2] / ".cache" / "vllm-envs"

#: Written inside ``root/version`` only after a complete, verified install.
MARKER = ".vllm-env-ok"

_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}(\.post\d+|rc\d+)?$")


def is_release_version(text: str) -> bool:
    """Whether ``text`` looks like a PyPI release version (``0.30.0``, ``0.8.5.post1``)."""
    return bool(_VERSION_RE.match(text))


def installed_version(path: Path) -> str | None:
    """Return the vLLM version recorded by the dist-info in ``path``, if any."""
    for meta in path.glob("vllm-*.dist-info/METADATA"):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def ensure_vllm_env(version: str, root: Path = DEFAULT_ROOT) -> Path:
    """Install vLLM ``version`` into ``root/version`` unless already done.

    Idempotent: a completed install carries the marker file :data:`MARKER`, and a
    second call returns at once.  The install goes to a temporary sibling
    directory that is renamed into place, so an interrupted install never leaves
    a directory with the marker.  Concurrent callers (processes) are
    serialised with a lock file.  Only pip runs, with ``--no-deps``; no
    dependency of the release is installed or changed.

    Returns the directory to put first on ``PYTHONPATH``.
    Raises ``ValueError`` for a malformed version and ``RuntimeError`` when
    pip fails or the result does not hold that release.
    """
    if not _VERSION_RE.match(version):
        raise ValueError(f"not a release version: {version!r}")
    root = Path(root).resolve()
    target = root / version
    if (target / MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MARKER).is_file():  # another process finished it
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.partial-", dir=root))
        try:
            start = time.monotonic()
            cmd = [
                sys.executable, "-m", "pip", "install", "--quiet",
                "--disable-pip-version-check", "--no-deps",
                "--target", str(staging), f"vllm=={version}",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"pip failed for vllm=={version} (rc={proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}"
                )
            got = installed_version(staging)
            if got != version or not (staging / "vllm" / "__init__.py").is_file():
                raise RuntimeError(f"vllm=={version} install holds version {got!r}")
            info = {
                "version": version,
                "install_seconds": round(time.monotonic() - start, 1),
                "python": sys.executable,
            }
            (staging / MARKER).write_text(json.dumps(info) + "\n", encoding="utf-8")
            if target.exists():  # leftover without a marker
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def cache_env(path: Path | None = None) -> dict[str, str]:
    """vLLM's and Hugging Face's cache directories for the vLLM at ``path``
    (``None``: the one this interpreter imports), one pair per vLLM install,
    under the system temporary directory.

    Why per install: vLLM caches what it learns about a model class
    (``modelinfos/``) under a key of the class's source file; an install
    whose file differs finds the entry stale and re-inspects the class in a
    subprocess that imports vLLM again (10-25 s of a worker's first
    scheduler example here, whenever another vLLM had used the same
    directory in between).
    """
    if path is None:
        spec = importlib.util.find_spec("vllm")  # finds the package without importing it
        location, name = (Path(spec.origin).resolve().parent if spec and spec.origin else None), "base"
    else:
        location = Path(path).resolve()
        name = location.name
    digest = hashlib.sha1(str(location).encode()).hexdigest()[:10]
    cache = Path(tempfile.gettempdir()) / "vllm-env-cache" / f"{name}-{digest}"
    return {"HF_HOME": str(cache / "hf"), "VLLM_CACHE_ROOT": str(cache / "vllm")}


def python_env_for(path: Path | None) -> dict[str, str]:
    """Environment for a subprocess that should import vLLM from ``path``.

    Starts from the current environment, puts ``path`` first on
    ``PYTHONPATH`` (``None``: leave it alone, i.e. the base venv's vLLM),
    forces the Hugging Face hub offline, and points vLLM's and Hugging Face's
    caches at a per-install directory (:func:`cache_env`) so that releases
    never share or write home-directory caches. Run it with the base venv's
    interpreter (``sys.executable``).
    """
    env = dict(os.environ)
    if path is not None:
        path = Path(path).resolve()
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(path) + (os.pathsep + old if old else "")
    env.update(
        cache_env(path),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
    )
    return env


if __name__ == "__main__":  # python -m fuzz.matrix.envs 0.28.0 0.29.0 ...
    for v in sys.argv[1:]:
        print(ensure_vllm_env(v, DEFAULT_ROOT))
