"""Model hyper-parameters for the decoder families spade_jax supports."""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer: Llama family (SmolLM2) or Qwen3 dense (q/k RMSNorm).

    Frozen and hashable so it can be a static argument of jitted functions.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    family: str = "llama"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_type: str = "default"  # "default" | "llama3"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    dtype: str = "float32"  # activations / compute
    param_dtype: str = "float32"

    def __post_init__(self):
        if self.family not in SUPPORTED_ARCHITECTURES.values():
            raise ValueError(
                f"unsupported model family {self.family!r}; supported: "
                f"{sorted(set(SUPPORTED_ARCHITECTURES.values()))}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {self.rope_type!r}; supported: default, llama3")

    @property
    def num_params(self) -> int:
        D, F, V, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        N, K, H = self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = D * (N + 2 * K) * H + N * H * D + 3 * D * F + 2 * D
        per_layer += 2 * H if self.qk_norm else 0
        return V * D * (1 if self.tie_word_embeddings else 2) + L * per_layer + D

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, hf: dict, **overrides: Any) -> "ModelConfig":
        """Builds a config from a Hugging Face `config.json` dict."""
        archs = hf.get("architectures") or []
        family = None
        for arch in archs:
            family = SUPPORTED_ARCHITECTURES.get(arch)
            if family:
                break
        if family is None:
            family = {"llama": "llama", "qwen3": "qwen3"}.get(hf.get("model_type", ""))
        if family is None:
            found = archs or [hf.get("model_type", "<none>")]
            raise ValueError(
                f"unsupported architecture {', '.join(map(str, found))}; supported: "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        heads = hf["num_attention_heads"]
        rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        fields = dict(
            family=family,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_type=rope_type,
            rope_factor=float(rope.get("factor", 1.0)),
            rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            rope_original_max_position=int(
                rope.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
            ),
            max_position_embeddings=hf.get("max_position_embeddings", 8192),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
        )
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("checkpoints with attention or MLP biases are not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; supported: silu")
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window) is not supported")
        fields.update(overrides)
        return cls(**fields)
