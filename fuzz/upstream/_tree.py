"""vLLM's own tests tree, prepared to run offline on CPU, and a runner that
puts test files into a scratch copy of it and runs vLLM's pytest on them.

The tree is the ``tests/`` directory of vLLM's source distribution for the
installed release, unpacked (never built) by ``scripts/fetch_vllm_tests.py``
into ``.cache/vllm-tests-VERSION/`` (``scripts/bootstrap.sh`` does it).
Preparing it for a lean CPU install takes three things, shared with
``scripts/vllm_tests_coverage.py``:

- a local Hugging Face cache holding a ``config.json`` for each model id the
  tests name (:data:`MODELS`, :func:`write_models`), read with the hub off;
- a minimal ``tests/conftest.py`` (:data:`CONFTEST`) in place of vLLM's
  top-level one, which imports the whole engine test stack;
- the environment of :func:`tree_env` (CPU platform, offline, caches inside
  the tree's directory).

:func:`run_in_tree` runs in one subprocess whose ``sys.path`` has the
scratch copy before this repository, so ``import tests...`` is vLLM's tests
package, and ``fuzz`` (for a planted bug) is this suite's.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = [
    "CONFTEST",
    "MODELS",
    "SKIP_REASON",
    "TreeOutcome",
    "run_in_tree",
    "tests_tree",
    "tree_env",
    "write_models",
]

REPO = Path(__file__).resolve().parents[2]
VERSION = importlib.metadata.version("vllm")
# Where scripts/fetch_vllm_tests.py unpacks the tree (DEST/tests).
TREE_PARENT = REPO / ".cache" / f"vllm-tests-{VERSION}"
SKIP_REASON = (
    f"no vLLM {VERSION} tests tree in .cache/vllm-tests-{VERSION}/tests: get it with "
    f"`python scripts/fetch_vllm_tests.py {VERSION} .cache/vllm-tests-{VERSION}` (bash scripts/bootstrap.sh does it)"
)

# Public config.json fields of the models vLLM's core and connector unit
# tests name, cut to what vLLM's config code reads (architecture, sizes,
# layer types).
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
fuzz/upstream/_tree.py): only the fixtures tests/v1/core and the
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

# The outcome file the in-tree plugin writes, and the planted bug it applies.
OUTCOMES_ENV = "FUZZ_UPSTREAM_OUTCOMES"
PLANT_ENV = "FUZZ_UPSTREAM_PLANT"


@dataclasses.dataclass(frozen=True)
class TreeOutcome:
    """One test's result in vLLM's tree: ``outcome`` is "passed", "failed",
    "error" (setup, teardown or collection) or "skipped"; ``message`` is
    pytest's crash message (for a failed assert: ``AssertionError: <its
    message>`` and pytest's explanation), the skip reason, or "" for a pass."""

    outcome: str
    message: str = ""


def tests_tree() -> Path | None:
    """The installed vLLM release's tests tree (the ``tests`` directory), or
    None where it has not been fetched (:data:`SKIP_REASON` says how)."""
    tree = TREE_PARENT / "tests"
    return tree if (tree / "v1" / "core" / "utils.py").is_file() else None


def write_models(hf_home: Path) -> None:
    """Write :data:`MODELS` into the Hugging Face cache ``hf_home`` as hub
    snapshots (idempotent)."""
    for model, config in MODELS.items():
        org, name = model.split("/")
        repo = hf_home / "hub" / f"models--{org}--{name}"
        _write_once(repo / "snapshots" / SNAPSHOT / "config.json", json.dumps(config, indent=1))
        _write_once(repo / "refs" / "main", SNAPSHOT)


def _write_once(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already; atomically, so a
    concurrent run reading the file never sees it half written."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def tree_env(parent: Path = TREE_PARENT) -> dict[str, str]:
    """The environment vLLM's tests need here: CPU, offline, the local
    Hugging Face cache and vLLM's cache under ``parent``."""
    return {
        "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
        "HF_HOME": str(parent / "hf"), "VLLM_CACHE_ROOT": str(parent / "vllm-cache"),
    }


def run_in_tree(
    files: dict[str, str], *, plant: str | dict[str, str] | None = None, timeout: float = 600
) -> dict[str, TreeOutcome]:
    """Run test files inside a scratch copy of vLLM's tests tree, in one
    pytest subprocess, offline on CPU; return each test's outcome by node id
    (``tests/v1/core/test_x.py::test_y``).

    ``files`` maps a path relative to the tree's ``tests`` directory
    (``v1/core/test_x.py``) to the file's source. With ``plant``, the
    subprocess runs under the suite's planted scheduler bug of that name
    (:func:`fuzz.adapter.planted_scheduler_bug`), or, for a mapping of such
    paths to names, each file's tests under their own. Nothing is written into
    the cached ``tests`` directory (the model configs go beside it). Raises ``FileNotFoundError`` (with :data:`SKIP_REASON`)
    where there is no tree, and ``RuntimeError`` where pytest reported no
    outcome for a file (its output attached)."""
    tree = tests_tree()
    if tree is None:
        raise FileNotFoundError(SKIP_REASON)
    for rel in files:
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not rel.endswith(".py"):
            raise ValueError(f"{rel!r}: expected a .py path inside the tests tree, like 'v1/core/test_x.py'")
    write_models(TREE_PARENT / "hf")
    with tempfile.TemporaryDirectory(prefix="vllm-tests-") as scratch:
        root = Path(scratch)
        shutil.copytree(tree, root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        (root / "tests" / "conftest.py").write_text(CONFTEST)
        for rel, source in files.items():
            path = root / "tests" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        outcomes = root / "outcomes.json"
        env = {**os.environ, **tree_env(), OUTCOMES_ENV: str(outcomes),
               # The scratch tree first: `tests` is vLLM's package, `fuzz` this suite's.
               "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
        for name in (PLANT_ENV, "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):  # nothing of the caller's pytest
            env.pop(name, None)
        if isinstance(plant, dict):
            env[PLANT_ENV] = json.dumps({f"tests/{rel}": name for rel, name in plant.items()})
        elif plant is not None:
            env[PLANT_ENV] = plant
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-p", "no:xdist", "-p", "fuzz.upstream._plugin", "--rootdir", str(root), "-c", os.devnull,
               "-o", "addopts=", "-o", "markers=cpu_test", "-W", "ignore", "--continue-on-collection-errors",
               *(f"tests/{rel}" for rel in files)]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        result = {node: TreeOutcome(*row) for node, row in json.loads(outcomes.read_text()).items()} \
            if outcomes.is_file() else {}
    missing = [rel for rel in files if not any(node.startswith(f"tests/{rel}") for node in result)]
    if missing:
        raise RuntimeError(f"pytest in vLLM's tree (exit {proc.returncode}) reported nothing for {missing}:\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return result
