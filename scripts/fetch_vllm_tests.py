"""Fetch the ``tests/`` tree of vLLM's source distribution on PyPI, unbuilt.

``pip download --no-binary :all: vllm==X`` cannot be used: pip prepares the
sdist's metadata, which runs vLLM's build (CMake, a CUDA torch). This asks
PyPI's simple index (the JSON form pip itself reads, PEP 691) for the
sdist's URL and sha256, downloads it, checks the digest and unpacks only
``tests/``.

Usage: python scripts/fetch_vllm_tests.py VERSION DEST  (DEST/tests appears)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path


def main(version: str, dest: Path) -> int:
    if (dest / "tests").is_dir():
        print(f"{dest / 'tests'}: already there")
        return 0
    req = urllib.request.Request("https://pypi.org/simple/vllm/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        index = json.load(r)
    sdist = next((f for f in index["files"] if f["filename"] == f"vllm-{version}.tar.gz"), None)
    if sdist is None:
        print(f"vllm {version}: no source distribution on PyPI", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / sdist["filename"]
        with urllib.request.urlopen(sdist["url"], timeout=300) as r, open(path, "wb") as out:
            shutil.copyfileobj(r, out)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sdist["hashes"]["sha256"]:
            print(f"{sdist['filename']}: sha256 {digest} != PyPI's {sdist['digests']['sha256']}", file=sys.stderr)
            return 2
        staging = Path(tmp) / "x"
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["tests"]]
            tar.extractall(staging, members=members, filter="data")
        top = next(staging.iterdir())
        dest.mkdir(parents=True, exist_ok=True)
        shutil.move(str(top / "tests"), dest / "tests")
    print(f"{dest / 'tests'}: from {sdist['filename']} (sha256 {digest[:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
