"""A `Policy` -> a Hugging Face model directory that transformers, vLLM and SGLang load as they are.

The directory holds `config.json` (LlamaForCausalLM, Qwen3ForCausalLM or Qwen3MoeForCausalLM),
the weights as `*.safetensors` (one file, or shards and `model.safetensors.index.json`, as
`save_pretrained` writes them), `generation_config.json` (the policy's stop tokens) and the
tokenizer files with its chat template (`export/tokenizer_files.py`).

The parameter <-> tensor mapping is `models/loading.py`'s, run backwards: each checkpoint tensor
role's conversion there is a reshape (experts: a transpose of the last two axes, and one tensor
per expert), so the stored layout is the parameter reshaped or transposed back. The safetensors
files are written here, not with `safetensors.numpy` (numpy has no bfloat16): every header is
known from the shapes before anything is read, so each parameter is gathered from its mesh,
converted, written and dropped in turn. No more than one parameter is ever held on the host.
The whole directory is written next to `out_dir` and renamed into place once complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from spade_jax.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from spade_jax.models.loading import _HF_NAMES, _lookup, _Target, _targets
from spade_jax.models.policy import Policy
from spade_jax.models.tokenizer import SentencePieceTokenizer

EXPORT_DTYPES = {"float32": "F32", "bfloat16": "BF16"}  # dtype -> safetensors dtype tag
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
INDEX_FILE = "model.safetensors.index.json"
_ARCHITECTURES = {family: arch for arch, family in SUPPORTED_ARCHITECTURES.items()}
_EXPERT_ROLES = frozenset(role for role, name in _HF_NAMES.items() if "{j}" in name)


class ExportError(ValueError):
    """A policy or destination that cannot be exported; the message names what to fix."""


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_hf` wrote: the directory, its weight files, tensor count and bytes, and seconds taken."""

    out_dir: Path
    weight_files: tuple[str, ...]
    tokenizer_files: tuple[str, ...]
    num_tensors: int
    weight_bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Source:
    """One model parameter and the checkpoint tensors (name, stored shape) it becomes."""

    path: tuple  # key path in the model's state
    role: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    def stored(self, value: np.ndarray) -> list[np.ndarray]:
        """The parameter's value in Hugging Face layout: one array per tensor, in `tensors` order."""
        if self.role in _EXPERT_ROLES:  # (experts, in, out) -> one (out, in) tensor per expert
            return list(value.swapaxes(1, 2))
        return [value.reshape(self.tensors[0][1])]


def _sources(config: ModelConfig) -> list[_Source]:
    """Every parameter of the model, in checkpoint order: embeddings, layer by layer, norm, head."""
    sources: list[tuple[int, _Source]] = []
    for target in _targets(config):
        for path, layer in target.paths(config.num_layers):
            sources.append((_order(target, layer, config), _Source(path, target.role, _names(target, layer))))
    return [s for _, s in sorted(sources, key=lambda item: item[0])]


def _order(target: _Target, layer: int | None, config: ModelConfig) -> int:
    if layer is not None:
        return layer
    return -1 if target.role == "embed" else config.num_layers


def _names(target: _Target, layer: int | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    template = _HF_NAMES[target.role]
    if target.role in _EXPERT_ROLES:
        return tuple((template.format(i=layer, j=j), target.stored_shape[1:]) for j in range(target.stored_shape[0]))
    return ((template.format(i=layer), target.stored_shape),)


def check_exportable(config: ModelConfig) -> str:
    """The transformers architecture of `config`; ExportError when no transformers class computes the same."""
    arch = _ARCHITECTURES.get(config.family)
    if arch is None:
        raise ExportError(f"model family {config.family!r} has no Hugging Face architecture; "
                          f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    if config.qk_norm != (config.family in ("qwen3", "qwen3_moe")):
        raise ExportError(f"a {config.family} model with qk_norm={config.qk_norm} matches no transformers "
                          f"architecture ({arch} has qk_norm={not config.qk_norm})")
    return arch


def hf_config(config: ModelConfig, *, dtype: str = "float32", bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict:
    """The `config.json` of `config` as transformers 5 reads it, and as older readers (transformers 4,
    vLLM) read it: rope under both `rope_parameters` and `rope_theta`/`rope_scaling`."""
    arch = check_exportable(config)
    rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
    if config.rope_type == "llama3":
        rope.update(factor=config.rope_factor, low_freq_factor=config.rope_low_freq_factor,
                    high_freq_factor=config.rope_high_freq_factor,
                    original_max_position_embeddings=config.rope_original_max_position)
    hf = {
        "architectures": [arch],
        "model_type": config.family,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": _shortest(config.rms_norm_eps),
        "rope_parameters": rope,
        "rope_theta": config.rope_theta,
        "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"} if config.rope_type != "default" else None,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "dtype": dtype,
        "use_cache": True,
    }
    if config.family == "llama":
        hf["mlp_bias"] = False
    else:
        hf.update(use_sliding_window=False, sliding_window=None)
    if config.family == "qwen3_moe":
        hf.update(num_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok,
                  moe_intermediate_size=config.moe_intermediate_size, norm_topk_prob=config.norm_topk_prob,
                  decoder_sparse_step=config.decoder_sparse_step, mlp_only_layers=list(config.mlp_only_layers))
    return hf


def _shortest(value: float) -> float:
    """A float32 value (GGUF metadata's 9.99999974e-06) as its shortest float32 spelling (1e-05): the
    same number to a float32 model, and what the published config.json says."""
    single = np.float32(value)
    return float(str(single)) if float(single) == value else value


def generation_config(tokenizer) -> dict:
    """`generation_config.json`: generation stops on every token the project's sampler stops on."""
    if tokenizer is None:
        return {}
    stops = [int(i) for i in tokenizer.eos_token_ids]
    ids = dict(_token_ids(tokenizer), eos_token_id=stops[0] if len(stops) == 1 else stops)
    return {key: value for key, value in ids.items() if value is not None}


def _token_ids(tokenizer) -> dict:
    """bos, eos (the first stop token, the exported tokenizer's eos_token) and pad ids of a tokenizer."""
    if tokenizer is None:
        return {}
    if isinstance(tokenizer, SentencePieceTokenizer):
        bos = tokenizer.sp.bos_id() if tokenizer.sp.bos_id() >= 0 else None
    else:
        bos = getattr(getattr(tokenizer, "hf", None), "bos_token_id", None)
    return dict(bos_token_id=bos, eos_token_id=int(tokenizer.eos_token_ids[0]), pad_token_id=int(tokenizer.pad_id))


def plan_shards(sizes: list[int], max_shard_bytes: int) -> list[list[int]]:
    """Consecutive groups of item indices, each under `max_shard_bytes` unless one item alone is larger."""
    if max_shard_bytes <= 0:
        raise ExportError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    shards: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if not shards or total + size > max_shard_bytes:
            shards.append([])
            total = 0
        shards[-1].append(i)
        total += size
    return shards


def _host(value: jax.Array) -> np.ndarray:
    """One parameter gathered to this host (from every process when the mesh spans several)."""
    if value.is_fully_addressable:
        return np.asarray(jax.device_get(value))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _write_shard(file: Path | None, sources: list[_Source], state: dict, dtype: str, bar) -> int:
    """Writes one safetensors file (None: gathers only, on the processes that do not write): its
    header, then each parameter's tensors as the parameter is gathered. Returns the data bytes."""
    np_dtype, tag = jnp.dtype(dtype), EXPORT_DTYPES[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for source in sources:
        for name, shape in source.tensors:
            size = int(np.prod(shape)) * np_dtype.itemsize
            header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
    f = open(file, "wb") if file is not None else None
    try:
        if f:
            f.write(struct.pack("<Q", len(blob)) + blob)
        for source in sources:
            value = _host(_lookup(state, source.path))
            for array, (name, shape) in zip(source.stored(value), source.tensors):
                if array.shape != shape:
                    raise ExportError(f"tensor {name}: shape {array.shape} from parameter "
                                      f"{'/'.join(map(str, source.path))}, expected {shape}")
                if f:
                    f.write(np.ascontiguousarray(array, dtype=np_dtype).reshape(-1).view(np.uint8))
            del value
            bar.update()
    finally:
        if f:
            f.close()
    return offset


def check_destination(out_dir) -> Path:
    """`out_dir` as a Path; ExportError unless it is absent or an empty directory."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} exists and is not an empty directory; choose a new one or delete it")
    return out_dir


def export_hf(policy: Policy, out_dir, *, dtype: str = "float32", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
              chat_template: str | None = None, progress: bool = True) -> ExportResult:
    """Writes `policy` (model, config, tokenizer) as a Hugging Face model directory at `out_dir`.

    `dtype` ("float32" or "bfloat16") is the stored weights'. Weights go in files of at most
    `max_shard_bytes` (a larger tensor gets a file of its own) with an index when there are
    several. The tokenizer files carry `chat_template` (default: the tokenizer's own, the one
    the run used); a policy without a tokenizer exports weights and configs only. `out_dir`
    must not exist or be empty. Every process of a multi-process run calls this; process 0 writes.
    An MoE model's capacity (`moe_capacity_factor`) is not exported: transformers routes dropless.
    """
    from spade_jax.progress import progress_bar

    start = time.perf_counter()
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"unsupported export dtype {dtype!r}; supported: {', '.join(EXPORT_DTYPES)}")
    config = policy.config
    out_dir = check_destination(out_dir)
    hf = hf_config(config, dtype=dtype, **_token_ids(policy.tokenizer))
    sources = _sources(config)
    itemsize = jnp.dtype(dtype).itemsize
    sizes = [sum(int(np.prod(shape)) for _, shape in s.tensors) * itemsize for s in sources]
    shards = plan_shards(sizes, max_shard_bytes)
    files = (["model.safetensors"] if len(shards) == 1
             else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    state = nnx.to_pure_dict(nnx.state(policy.model, nnx.Param))
    writer = jax.process_index() == 0
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent)) if writer else None
    try:
        total = 0
        tokenizer_files: list[str] = []
        with progress_bar(len(sources), "export", unit="tensor", enabled=progress and writer) as bar:
            for file, shard in zip(files, shards):
                total += _write_shard(staging / file if writer else None, [sources[i] for i in shard], state,
                                      dtype, bar)
        if writer:
            if len(files) > 1:
                weight_map = {name: file for file, shard in zip(files, shards)
                              for i in shard for name, _ in sources[i].tensors}
                _write_json(staging / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
            _write_json(staging / "config.json", hf)
            _write_json(staging / "generation_config.json", generation_config(policy.tokenizer))
            if policy.tokenizer is not None:
                from spade_jax.export.tokenizer_files import save_tokenizer

                tokenizer_files = list(save_tokenizer(policy.tokenizer, staging, chat_template=chat_template))
            else:
                logging.info("the policy has no tokenizer: %s holds weights and configs only", out_dir)
            os.chmod(staging, 0o755)  # mkdtemp made it private
            if out_dir.exists():
                out_dir.rmdir()
            os.replace(staging, out_dir)
            staging = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    seconds = time.perf_counter() - start
    logging.info("exported %s (%s, %.1fM parameters, %s) to %s: %d files, %.1f MB in %.1fs",
                 hf["architectures"][0], config.family, config.num_params / 1e6, dtype, out_dir, len(files),
                 total / 1e6, seconds)
    return ExportResult(out_dir, tuple(files), tuple(tokenizer_files),
                        sum(len(s.tensors) for s in sources), total, seconds)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def tensor_names(config: ModelConfig) -> Iterator[str]:
    """Every tensor name an export of `config` writes, in file order."""
    for source in _sources(config):
        for name, _ in source.tensors:
            yield name
