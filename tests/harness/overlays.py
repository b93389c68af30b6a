"""vLLM overlays: the installed vLLM with a few source lines changed, as a
source checkout ``--vllm-src`` can point at (what a contributor's branch or
the next release looks like to the suite).

The overlay is a tree of symbolic links to the installed package, except the
edited files (and the directories above them), which are real copies. Nothing
is built: vLLM's core is pure Python, and its compiled parts are linked.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["installed_vllm", "make_overlay"]


def installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def _link_tree(src: Path, dst: Path, keep: set[Path]) -> None:
    """Mirror ``src`` into ``dst``: a link per entry, a real directory for
    every directory on the way to a path in ``keep``."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and any(k == entry or entry in k.parents for k in keep):
            _link_tree(entry, target, keep)
        elif entry not in keep:
            os.symlink(entry, target)


def make_overlay(root: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    """An overlay of the installed vLLM under ``root`` (returned: the
    checkout root holding ``vllm/``), with each file of ``edits`` (path
    inside the package) rewritten by its ``(old, new)`` replacements, each
    ``old`` required to occur."""
    pkg = installed_vllm()
    files = {pkg / rel: changes for rel, changes in edits.items()}
    _link_tree(pkg, root / "vllm", set(files))
    for path, changes in files.items():
        text = path.read_text()
        for old, new in changes:
            assert old in text, f"{old!r} not in {path}"
            text = text.replace(old, new)
        (root / "vllm" / path.relative_to(pkg)).write_text(text)
    return root
