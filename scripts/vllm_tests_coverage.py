"""Run vLLM's own unit tests of the KV-cache and scheduler code under the
campaign's coverage measurement (fuzz/coverage/__init__.py) and print the same tables.

Called by scripts/vllm-tests-coverage.sh, which fetches the tests and sets
the environment (VLLM_TARGET_DEVICE=cpu, HF_HUB_OFFLINE=1, a local HF_HOME).

    python scripts/vllm_tests_coverage.py TESTS_PARENT OUT_DIR [pytest selection...]

- writes a ``config.json`` for each model id the tests name into the local
  Hugging Face cache (``$HF_HOME``), so nothing is fetched;
- puts a minimal ``tests/conftest.py`` in place of vLLM's top-level one
  (which imports the whole engine test stack: GPUs, datasets, servers);
- runs pytest in this process under coverage.py with the campaign's
  settings (branch coverage, the same six modules), saving
  ``OUT_DIR/.coverage``;
- prints the per-file and per-function tables and the never-taken branches
  (:func:`fuzz.coverage.markdown`), and the tests that could not run on
  the lean CPU install, grouped by why (from pytest's JUnit XML).
"""

from __future__ import annotations

import collections
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The preparation shared with the upstream-form tests: model configs, conftest.
from fuzz.upstream._tree import CONFTEST, write_models  # noqa: E402

# Why a test could not run on a lean CPU install, from its error text:
# (pattern, reason). The first that matches wins.
REASONS: tuple[tuple[str, str], ...] = (
    (r"No module named '([\w.]+)'", "needs Python package {0} (not in the lean install)"),
    (r"fixture '(\w+)' not found", "needs vLLM's full test conftest (fixture {0})"),
    (r"(llava|Qwen2\.5-VL|Qwen3\.5|RedHatAI/)", "a multimodal / hub model with no local config ({0})"),
    (r"(LocalEntryNotFoundError|OfflineModeIsEnabled|offline mode|couldn't connect to 'https://huggingface.co')",
     "needs files from the Hugging Face hub (offline here)"),
    (r"(tokenizer|Tokenizer)", "needs a tokenizer (not fetched offline)"),
    (r"(CUDA|cuda|NCCL|nccl|GPU)", "needs a GPU"),
    (r"(vllm\._C|_custom_ops|torch\.ops\._C)", "needs vLLM's compiled kernels"),
    (r"(LLM\(|EngineCore|AsyncLLM|start_engine)", "starts a whole engine (model weights, workers)"),
)


def why(text: str) -> str:
    for pattern, reason in REASONS:
        m = re.search(pattern, text)
        if m:
            return reason.format(*m.groups())
    first = next((ln for ln in text.splitlines() if "Error" in ln or "error" in ln), text.splitlines()[0] if text else "")
    return "other: " + first.strip()[:140]


def not_run(junit: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Outcome counts, and the tests that failed, errored or were skipped, grouped by reason."""
    counts: collections.Counter[str] = collections.Counter()
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        # A collection error has no class name: its name is the file.
        name = f"{case.get('classname') or case.get('name', '')}::{case.get('name', '')}"
        bad = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if bad is None:
            counts["passed"] += 1
            continue
        counts[{"failure": "failed", "error": "error", "skipped": "skipped"}[bad.tag]] += 1
        text = (bad.get("message") or "") + "\n" + (bad.text or "")
        groups[("skipped: " if bad.tag == "skipped" else "") + why(text)].append(name)
    return dict(counts), groups


def main() -> int:
    tests_parent, out_dir, *selection = sys.argv[1:]
    parent, out = Path(tests_parent).resolve(), Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_models(Path(os.environ["HF_HOME"]))
    (parent / "tests" / "conftest.py").write_text(CONFTEST)
    import coverage

    from fuzz import coverage as fuzz_coverage

    root = fuzz_coverage.vllm_root()
    data = out / fuzz_coverage.DATA_FILE
    data.unlink(missing_ok=True)
    cov = coverage.Coverage(data_file=str(data), branch=True, config_file=False,
                            include=[str(root / m) for m in fuzz_coverage.MODULES])
    junit = out / "junit.xml"
    os.chdir(parent)  # `import tests.v1...` resolves to this copy; `import vllm` to the installed one
    sys.path.insert(0, str(parent))
    cov.start()
    import pytest

    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(parent),
                      "-c", os.devnull, "--continue-on-collection-errors", "-o", "addopts=",
                      "-W", "ignore", "--junitxml", str(junit), *(selection or ["tests/v1/core"])])
    cov.stop()
    cov.save()
    (out / fuzz_coverage.TIMELINE).unlink(missing_ok=True)  # no timeline: one run, no campaign
    section = fuzz_coverage.report_section(out)
    md = section[0] if section else ["no coverage data"]
    counts, groups = not_run(junit)
    lines = [f"# vLLM {fuzz_coverage.summarize(out).vllm_version if section else '?'} tests under coverage",
             "", f"pytest exit {rc}; outcomes: {counts}", "", *md,
             "## Tests that could not run on this lean CPU install", ""]
    for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        files = collections.Counter(n.split("::")[0] for n in names)
        lines.append(f"- {reason}: {len(names)} test(s) in " + ", ".join(f"{f} ({k})" for f, k in files.most_common(8))
                     + (" ..." if len(files) > 8 else ""))
    text = "\n".join(lines) + "\n"
    (out / "vllm-tests-coverage.md").write_text(text)
    print(text)
    print(f"written: {out / 'vllm-tests-coverage.md'}, {out / 'coverage-summary.json'}, {data}")
    return 0 if rc in (0, 1) else int(rc)


if __name__ == "__main__":
    sys.exit(main())
