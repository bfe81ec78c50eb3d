"""Model hyper-parameters for the decoder families spade_jax supports."""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer: Llama family (SmolLM2), Qwen3 dense (q/k RMSNorm) or
    Qwen3-MoE (Qwen3 attention; a routed mixture of SwiGLU experts in the sparse layers).

    Frozen and hashable so it can be a static argument of jitted functions. The MoE fields
    mean what transformers' `Qwen3MoeConfig` means: layer i is sparse when `num_experts > 0`,
    i is not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`; dense layers use
    `intermediate_size`, experts `moe_intermediate_size`. `moe_capacity_factor` 0 routes every
    token to all its experts (dropless); c > 0 gives each expert room for c times its fair
    share of a dispatch's assignments, at least `moe_min_capacity`, and drops the rest (see
    `models/moe.py`).
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
    num_experts: int = 0  # 0 = dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    moe_capacity_factor: float = 0.0  # 0 = dropless
    moe_min_capacity: int = 64  # buffer rows per expert a capacity never goes below
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
        if (self.family == "qwen3_moe") != (self.num_experts > 0):
            raise ValueError(f"family {self.family!r} with num_experts={self.num_experts}: only qwen3_moe has experts")
        if self.num_experts and not (1 <= self.num_experts_per_tok <= self.num_experts
                                     and self.moe_intermediate_size > 0 and self.decoder_sparse_step >= 1):
            raise ValueError(
                f"MoE needs 1 <= num_experts_per_tok ({self.num_experts_per_tok}) <= num_experts "
                f"({self.num_experts}), moe_intermediate_size > 0 ({self.moe_intermediate_size}) and "
                f"decoder_sparse_step >= 1 ({self.decoder_sparse_step})")
        if self.moe_capacity_factor < 0 or self.moe_min_capacity < 1:
            raise ValueError(f"moe_capacity_factor must be >= 0 (0 = dropless) and moe_min_capacity >= 1, got "
                             f"{self.moe_capacity_factor} and {self.moe_min_capacity}")
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer` has routed experts (transformers' `Qwen3MoeDecoderLayer` rule)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        return tuple(self.is_sparse(i) for i in range(self.num_layers))

    @property
    def num_params(self) -> int:
        return self._count_params(self.num_experts)

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through: `num_params` with only its routed experts."""
        return self._count_params(self.num_experts_per_tok)

    def _count_params(self, experts_counted: int) -> int:
        D, F, V = self.hidden_size, self.intermediate_size, self.vocab_size
        N, K, H = self.num_heads, self.num_kv_heads, self.head_dim
        attention = D * (N + 2 * K) * H + N * H * D + 2 * D + (2 * H if self.qk_norm else 0)
        sparse = sum(self.sparse_layers)
        dense_mlp = (self.num_layers - sparse) * 3 * D * F
        expert_mlp = sparse * (self.num_experts * D + experts_counted * 3 * D * self.moe_intermediate_size)
        return V * D * (1 if self.tie_word_embeddings else 2) + self.num_layers * attention + dense_mlp + expert_mlp + D

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
            family = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}.get(hf.get("model_type", ""))
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
            qk_norm=family in ("qwen3", "qwen3_moe"),
        )
        if family == "qwen3_moe":
            fields.update(
                # transformers 5 writes num_local_experts; the published configs say num_experts
                num_experts=hf.get("num_experts") or hf["num_local_experts"],
                num_experts_per_tok=hf["num_experts_per_tok"],
                moe_intermediate_size=hf["moe_intermediate_size"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                decoder_sparse_step=hf.get("decoder_sparse_step", 1),
                mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
            )
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("checkpoints with attention or MLP biases are not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported; supported: silu")
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window) is not supported")
        fields.update(overrides)
        return cls(**fields)
