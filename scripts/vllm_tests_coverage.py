"""Run vLLM's own unit tests of the KV-cache and scheduler code under the
campaign's coverage measurement (fuzz/coverage.py) and print the same tables.

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
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Public config.json fields of the models the selected tests name, cut to
# what vLLM's config code reads (architecture, sizes, layer types).
MODELS: dict[str, dict[str, object]] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "num_attention_heads": 12,
        "num_hidden_layers": 12, "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 768, "do_layer_norm_before": True, "activation_function": "relu",
        "torch_dtype": "float16", "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
    },
    "facebook/opt-350m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 1024, "num_attention_heads": 16,
        "num_hidden_layers": 24, "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048,
        "word_embed_proj_dim": 512, "do_layer_norm_before": False, "activation_function": "relu",
        "torch_dtype": "float16", "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
    },
    "Qwen/Qwen1.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28, "intermediate_size": 3072,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_hidden_layers": 48,
        "intermediate_size": 5120, "vocab_size": 151936, "max_position_embeddings": 262144,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "norm_topk_prob": True,
        "partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "mlp_only_layers": [],
    },
    "hmellor/tiny-random-LlamaForCausalLM": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "float32",
    },
}

SNAPSHOT = "0" * 40

CONFTEST = '''"""Minimal stand-in for vLLM's tests/conftest.py (written by
scripts/vllm_tests_coverage.py): only the fixtures tests/v1/core and the
connector unit tests use; the rest of vLLM's test stack is not installed."""

import logging

import pytest


@pytest.fixture
def default_vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture()
def caplog_vllm(monkeypatch, caplog):
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    # vLLM's logger does not propagate to the root logger caplog reads.
    monkeypatch.setitem(DEFAULT_LOGGING_CONFIG["loggers"]["vllm"], "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.INFO):
        yield caplog
'''


def write_models(hf_home: Path) -> None:
    for model, config in MODELS.items():
        org, name = model.split("/")
        repo = hf_home / "hub" / f"models--{org}--{name}"
        snap = repo / "snapshots" / SNAPSHOT
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text(json.dumps(config, indent=1))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(SNAPSHOT)


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
