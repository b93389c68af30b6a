"""The vLLM releases the matrix runs (their documented bugs are in fuzz/known_bugs.py)."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fuzz.matrix.envs import is_release_version

__all__ = [
    "REFERENCE_RELEASES",
    "SUPPORTED_RELEASES",
    "Release",
    "parse_release",
    "releases",
]

#: Releases the suite supports, oldest first.
SUPPORTED_RELEASES: tuple[str, ...] = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
#: Out-of-support releases run with ``--reference``, and why they are interesting.
REFERENCE_RELEASES: dict[str, str] = {
    "0.27.1": "pre-fix reference, not supported",
}


# Three components, as vLLM releases are numbered (pip would take "0.3" as 0.3.0).
_FULL_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+")


@dataclass(frozen=True)
class Release:
    """One row group of the matrix.

    ``spec`` is what the user wrote (``0.30.0`` or ``src:/abs/path``);
    ``path`` the directory put first on ``PYTHONPATH`` (``None``: the base
    venv's own vLLM); ``reference`` marks a pre-fix reference row.
    """

    spec: str
    kind: str  # "pypi", "base" or "src"
    path: Path | None = None
    reference: bool = False

    @property
    def label(self) -> str:
        if self.reference:
            return f"{self.spec} ({REFERENCE_RELEASES.get(self.spec, 'reference, not supported')})"
        if self.kind == "base":
            return f"{self.spec} (base venv)"
        return self.spec


def base_vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_release(text: str, *, reference: bool = False) -> Release:
    """``0.30.0`` -> a PyPI release (the base venv's own when it is that
    version); ``src:PATH`` -> a source checkout. ValueError (one line) otherwise."""
    if text.startswith("src:"):
        raw = text[4:]
        if not raw:
            raise ValueError("src: needs a path, e.g. src:/path/to/vllm-checkout")
        path = Path(raw).expanduser().resolve()
        if not (path / "vllm" / "__init__.py").is_file():
            raise ValueError(f"{text}: no vllm/__init__.py under {path} (expected a vLLM checkout root)")
        if not (path / "vllm" / "v1" / "core" / "kv_cache_manager.py").is_file():
            raise ValueError(f"{text}: {path}/vllm has no v1/core/kv_cache_manager.py (not a V1 vLLM)")
        return Release(spec=f"src:{path}", kind="src", path=path)
    if not (is_release_version(text) and _FULL_VERSION_RE.match(text)):
        raise ValueError(f"release {text!r}: expected a version like 0.30.0 or src:/path/to/vllm-checkout")
    kind = "base" if text == base_vllm_version() else "pypi"
    return Release(spec=text, kind=kind, reference=reference or text in REFERENCE_RELEASES)


def releases(specs: Sequence[str], *, reference: bool = False, sources: Sequence[str] = ()) -> list[Release]:
    """The rows to run, in order, each once: ``specs`` (default: every
    supported release), the reference releases first with ``reference``,
    then the source checkouts."""
    rows = [parse_release(s) for s in (list(specs) or list(SUPPORTED_RELEASES))]
    if reference:
        rows = [parse_release(v, reference=True) for v in REFERENCE_RELEASES] + rows
    rows += [parse_release(f"src:{p}") for p in sources]
    seen: set[str] = set()
    unique = []
    for r in rows:
        if r.spec not in seen:
            seen.add(r.spec)
            unique.append(r)
    return unique
