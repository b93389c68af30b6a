"""An engine-reachable configuration: a model's ``config.json`` and the cache
flags an operator passes, before vLLM plans anything.

The adapter (``fuzz.adapter._engine_plan``) hands these to vLLM's own
planning code (the model's ``verify_and_update_config`` hooks, the
platform's hybrid block-size alignment, ``get_kv_cache_configs`` and the
block-size resolver); what comes out is the KV-cache layout the engine core
hands the scheduler.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = ["ENGINE_REACHABLE", "SCHEDULER_API", "EngineDraw", "reach_label"]

# The two kinds of scheduler-tier finding. vLLM's own unit tests build
# schedulers directly, so both matter, but a maintainer must see which it is.
ENGINE_REACHABLE = "engine-reachable"
SCHEDULER_API = "scheduler-API"


@dataclasses.dataclass(frozen=True)
class EngineDraw:
    """A model (its ``config.json``, as sorted ``(key, json)`` pairs so the
    draw stays hashable) and the cache flags of ``vllm serve``:
    ``--block-size`` (None: the backend's choice), ``--mamba-cache-mode``,
    ``--mamba-block-size``, ``--prefix-match-unit``, ``--dtype`` and prefix
    caching (on: the branch under test needs it).

    ``name`` is the architecture family the strategy drew ("nemotron-h",
    "gemma-3", ...), for reports only.
    """

    name: str
    hf_config: tuple[tuple[str, str], ...]
    dtype: str = "bfloat16"
    block_size: int | None = None
    mamba_cache_mode: str = "none"
    mamba_block_size: int | None = None
    prefix_match_unit: int | None = None
    enable_prefix_caching: bool = True

    @classmethod
    def of(cls, name: str, hf_config: dict[str, Any], **cache: Any) -> EngineDraw:
        pairs = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in hf_config.items()))
        return cls(name, pairs, **cache)

    def config_dict(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.hf_config}

    @property
    def architecture(self) -> str:
        return self.config_dict()["architectures"][0]

    def __repr__(self) -> str:
        cfg = self.config_dict()
        shown = {
            k: cfg[k]
            for k in (
                "num_hidden_layers",
                "hybrid_override_pattern",
                "layer_types",
                "layers_block_type",
                "attn_layer_period",
                "sliding_window",
                "num_key_value_heads",
                "head_dim",
                "mamba_d_state",
                "ssm_state_size",
            )
            if k in cfg
        }
        flags = [f"dtype={self.dtype!r}"]
        for flag in ("block_size", "mamba_block_size", "prefix_match_unit"):
            if getattr(self, flag) is not None:
                flags.append(f"{flag}={getattr(self, flag)}")
        if self.mamba_cache_mode != "none":
            flags.append(f"mamba_cache_mode={self.mamba_cache_mode!r}")
        return f"Engine({self.name}: {self.architecture} {shown}, {', '.join(flags)})"


def reach_label(engine: EngineDraw | None) -> tuple[str, str]:
    """(label, reason) for a scheduler-tier configuration."""
    if engine is not None:
        return (
            ENGINE_REACHABLE,
            f"KV-cache config planned by vLLM's engine code from a {engine.architecture} config.json",
        )
    return (
        SCHEDULER_API,
        "KV-cache layout built directly (as vLLM's unit tests do); no engine path is known to build it",
    )
