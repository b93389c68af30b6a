"""vLLM learns about the suite's model classes in-process, never in the
subprocess its registry starts for a lazily registered class
(``fuzz.adapter._compat.inspect_models_in_process``).

On a fresh machine that subprocess (vLLM imported again, about 6 s) ran for
every architecture a campaign worker met first: 13 of a default 60 s
campaign's seconds went to two of them. Here the subprocess raises, vLLM's
model-info cache is empty, and every local model the adapter builds a
``ModelConfig`` for still builds; the control shows the same build without
the adapter's step reaching the subprocess.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm.config import ModelConfig
from vllm.model_executor.models import registry
from vllm.model_executor.models.registry import ModelRegistry

from fuzz.adapter import _compat, _config

KINDS = ("plain", "hybrid", "eagle-draft")


class _Subprocess(Exception):
    pass


CALLS: list[str] = []


def _lazy_again(monkeypatch: pytest.MonkeyPatch, kind: str, cache: Path) -> str:
    """Register the kind's architecture lazily again, as vLLM ships it, with
    an empty model-info cache and the subprocess raising."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))

    def subprocess(*args: object, **kwargs: object) -> None:
        CALLS.append(kind)
        raise _Subprocess(f"vLLM inspected a model class in a subprocess for {kind!r}")

    monkeypatch.setattr(registry, "_run_in_subprocess", subprocess)
    with open(os.path.join(_config._model_dir(kind), "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    entry = ModelRegistry.models[arch]
    if hasattr(entry, "model_cls"):  # inspected in-process earlier in this session
        entry = registry._LazyRegisteredModel(entry.model_cls.__module__, entry.model_cls.__name__)
    monkeypatch.setitem(ModelRegistry.models, arch, entry)
    monkeypatch.setattr(_compat, "_INSPECTED", set())
    return arch


def _model_config(kind: str) -> ModelConfig:
    return ModelConfig(model=_config._model_dir(kind), skip_tokenizer_init=True, dtype="float32", seed=0,
                       max_model_len=256)


@pytest.mark.parametrize("kind", KINDS)
def test_the_adapter_builds_model_configs_without_vllms_subprocess(
    kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    arch = _lazy_again(monkeypatch, kind, tmp_path)
    CALLS.clear()
    _compat.inspect_models_in_process(_config._model_dir(kind))
    config = _model_config(kind)
    assert not CALLS
    assert arch in config.architectures
    assert not (tmp_path / "modelinfos").exists(), "vLLM cached a subprocess's answer"


def test_control_without_the_adapter_vllm_reaches_for_the_subprocess(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _lazy_again(monkeypatch, "plain", tmp_path)
    CALLS.clear()
    # vLLM logs the subprocess's failure and refuses the architecture.
    with pytest.raises(ValueError, match="failed to be inspected"):
        _model_config("plain")
    assert CALLS == ["plain"]
