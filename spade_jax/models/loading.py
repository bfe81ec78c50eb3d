"""Checkpoint import: a Hugging Face directory (safetensors) or a GGUF file -> `Policy`.

The model is built abstractly (shapes only), the checkpoint's tensor names and
shapes are checked against it before anything is read, and then each parameter is
converted on the host from its lazily read (memory-mapped) checkpoint tensor, one
tensor at a time, and placed straight onto its `NamedSharding`. No host copy of the whole model exists at any point.

Checkpoint tensors are named by role ("q", "gate", ...) and kept in Hugging Face
layout `(out_features, in_features)` until converted to the model's layout.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from pathlib import Path
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from spade_jax.models.config import ModelConfig
from spade_jax.models.policy import Policy, abstract_model
from spade_jax.models.sharding import TRAIN_RULES, Rules, make_mesh, param_shardings

SUPPORTED_DTYPES = ("float32", "bfloat16", "float64")  # float64: exact-arithmetic checks, needs jax_enable_x64
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen3", "qwen3moe")
_GGUF_FAMILIES = {"qwen3moe": "qwen3_moe"}  # GGUF architecture -> ModelConfig.family where they differ
_PROGRESS_MIN_BYTES = 100_000_000  # report loading progress from this many parameter bytes


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names what to fix."""


@dataclasses.dataclass(frozen=True)
class _Target:
    """One model parameter and the checkpoint tensor(s) it is made from."""

    path: tuple[str, ...]  # key path in the model's state (below `layers/{i}` when per_layer)
    role: str  # checkpoint tensor role, see _HF_NAMES / _GGUF_NAMES
    stored_shape: tuple[int, ...]  # Hugging Face layout
    convert: Callable[[np.ndarray], np.ndarray]  # stored layout -> model layout
    per_layer: bool
    layers: tuple[int, ...] | None = None  # the layers that have it (None: all, when per_layer)

    def layer_indices(self, num_layers: int) -> list[int | None]:
        if not self.per_layer:
            return [None]
        return list(range(num_layers) if self.layers is None else self.layers)

    def paths(self, num_layers: int) -> list[tuple[tuple, int | None]]:
        """(state key path, layer index) of every parameter this target fills."""
        return [(self.path if i is None else ("layers", i) + self.path, i) for i in self.layer_indices(num_layers)]


def _targets(cfg: ModelConfig) -> list[_Target]:
    """Every parameter of `Transformer(cfg)` and how to build it from a checkpoint."""
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    E, Fe = cfg.num_experts, cfg.moe_intermediate_size
    dense = tuple(i for i, sparse in enumerate(cfg.sparse_layers) if not sparse)
    sparse = tuple(i for i, sparse in enumerate(cfg.sparse_layers) if sparse)

    def same(w):
        return w

    def in_out(w):  # experts: stored (experts, out, in), kept (experts, in, out)
        return w.swapaxes(1, 2)

    targets = [
        _Target(("embed_VD",), "embed", (V, D), same, False),
        _Target(("final_norm_D",), "final_norm", (D,), same, False),
        _Target(("attn_norm_D",), "attn_norm", (D,), same, True),
        _Target(("mlp_norm_D",), "mlp_norm", (D,), same, True),
        _Target(("attn", "q_NHD"), "q", (N * H, D), lambda w: w.reshape(N, H, D), True),
        _Target(("attn", "k_KHD"), "k", (K * H, D), lambda w: w.reshape(K, H, D), True),
        _Target(("attn", "v_KHD"), "v", (K * H, D), lambda w: w.reshape(K, H, D), True),
        _Target(("attn", "o_DNH"), "o", (D, N * H), lambda w: w.reshape(D, N, H), True),
        _Target(("mlp", "gate_FD"), "gate", (F, D), same, True, dense),
        _Target(("mlp", "up_FD"), "up", (F, D), same, True, dense),
        _Target(("mlp", "down_DF"), "down", (D, F), same, True, dense),
    ]
    if sparse:
        targets += [
            _Target(("mlp", "router_ED"), "router", (E, D), same, True, sparse),
            _Target(("mlp", "gate_EDF"), "expert_gate", (E, Fe, D), in_out, True, sparse),
            _Target(("mlp", "up_EDF"), "expert_up", (E, Fe, D), in_out, True, sparse),
            _Target(("mlp", "down_EFD"), "expert_down", (E, D, Fe), in_out, True, sparse),
        ]
    if cfg.qk_norm:
        targets += [
            _Target(("attn", "q_norm_H"), "q_norm", (H,), same, True),
            _Target(("attn", "k_norm_H"), "k_norm", (H,), same, True),
        ]
    if not cfg.tie_word_embeddings:
        targets.append(_Target(("lm_head_VD",), "lm_head", (V, D), same, False))
    return targets


_HF_NAMES = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "q": "model.layers.{i}.self_attn.q_proj.weight",
    "k": "model.layers.{i}.self_attn.k_proj.weight",
    "v": "model.layers.{i}.self_attn.v_proj.weight",
    "o": "model.layers.{i}.self_attn.o_proj.weight",
    "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.weight",
    "up": "model.layers.{i}.mlp.up_proj.weight",
    "down": "model.layers.{i}.mlp.down_proj.weight",
    "router": "model.layers.{i}.mlp.gate.weight",
    # one tensor per expert j, stacked when read
    "expert_gate": "model.layers.{i}.mlp.experts.{j}.gate_proj.weight",
    "expert_up": "model.layers.{i}.mlp.experts.{j}.up_proj.weight",
    "expert_down": "model.layers.{i}.mlp.experts.{j}.down_proj.weight",
}

_GGUF_NAMES = {
    "embed": "token_embd.weight",
    "final_norm": "output_norm.weight",
    "lm_head": "output.weight",
    "attn_norm": "blk.{i}.attn_norm.weight",
    "mlp_norm": "blk.{i}.ffn_norm.weight",
    "q": "blk.{i}.attn_q.weight",
    "k": "blk.{i}.attn_k.weight",
    "v": "blk.{i}.attn_v.weight",
    "o": "blk.{i}.attn_output.weight",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "gate": "blk.{i}.ffn_gate.weight",
    "up": "blk.{i}.ffn_up.weight",
    "down": "blk.{i}.ffn_down.weight",
    "router": "blk.{i}.ffn_gate_inp.weight",
    # every expert in one tensor
    "expert_gate": "blk.{i}.ffn_gate_exps.weight",
    "expert_up": "blk.{i}.ffn_up_exps.weight",
    "expert_down": "blk.{i}.ffn_down_exps.weight",
}


class _Checkpoint:
    """Tensor names, shapes (Hugging Face layout) and a lazy reader."""

    names: dict[str, str]  # role -> name template
    shapes: dict[str, tuple[int, ...]]
    ignored: frozenset[str] = frozenset()  # present but deliberately unused

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def tensors(self, role: str, layer: int | None, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The stored tensors (name -> shape) a parameter of `shape` (stored layout) is read from:
        one per expert when the name template has a "{j}", else one."""
        template = self.names[role]
        if "{j}" in template:
            return {template.format(i=layer, j=j): shape[1:] for j in range(shape[0])}
        return {template.format(i=layer): shape}

    def load(self, role: str, layer: int | None, shape: tuple[int, ...]) -> np.ndarray:
        arrays = [self.read(name) for name in self.tensors(role, layer, shape)]
        return np.stack(arrays) if "{j}" in self.names[role] else arrays[0]


# ---------------------------------------------------------------- safetensors

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,
}


class _SafetensorsCheckpoint(_Checkpoint):
    """`*.safetensors` files read through memory maps.

    The header is parsed here rather than with `safetensors.safe_open(framework="np")`,
    which cannot return bfloat16 tensors (numpy has no such dtype); arrays are views
    of the mapped file, so nothing is read before it is needed.
    """

    names = _HF_NAMES

    def __init__(self, files: list[Path]):
        self.shapes = {}
        self._where: dict[str, tuple[Path, int, int, str]] = {}
        self._maps: dict[Path, np.memmap] = {}
        for file in files:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
            header.pop("__metadata__", None)
            for name, info in header.items():
                if name in self._where:
                    raise CheckpointError(f"tensor {name} appears in both {self._where[name][0]} and {file}")
                begin, end = info["data_offsets"]
                self.shapes[name] = tuple(info["shape"])
                self._where[name] = (file, 8 + size + begin, 8 + size + end, info["dtype"])

    def read(self, name: str) -> np.ndarray:
        file, begin, end, dtype = self._where[name]
        if dtype not in _SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"tensor {name} in {file} has dtype {dtype}; supported: {', '.join(_SAFETENSORS_DTYPES)}"
            )
        if file not in self._maps:
            self._maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
        raw = self._maps[file][begin:end]
        return raw.view(_SAFETENSORS_DTYPES[dtype]).reshape(self.shapes[name])


def _open_hf_directory(path: Path, dtype: str) -> tuple[ModelConfig, _Checkpoint]:
    config_file = path / "config.json"
    if not config_file.exists():
        raise CheckpointError(
            f"{path} has no config.json; expected a Hugging Face model directory "
            "(config.json + *.safetensors) or a .gguf file"
        )
    try:
        config = ModelConfig.from_hf_config(json.loads(config_file.read_text()), dtype=dtype, param_dtype=dtype)
    except (ValueError, KeyError) as e:
        reason = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise CheckpointError(f"{config_file}: {reason}") from None
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({path / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index} lists shard files that do not exist: {', '.join(missing)}")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no *.safetensors weights in {path}; save the model with "
            "save_pretrained(..., safe_serialization=True)"
        )
    checkpoint = _SafetensorsCheckpoint(files)
    ignored = {n for n in checkpoint.shapes if n.endswith(".rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        ignored.add(_HF_NAMES["lm_head"])  # some tied checkpoints also store the (identical) head
    checkpoint.ignored = frozenset(ignored)
    return config, checkpoint


# ----------------------------------------------------------------------- GGUF


class _GGUFCheckpoint(_Checkpoint):
    """A GGUF file; tensors are dequantised to float32 when read.

    llama.cpp stores Llama-family q/k projections with the rows of each head
    interleaved for its rotary layout; they are permuted back to Hugging Face order.
    """

    names = _GGUF_NAMES

    def __init__(self, reader, shapes: dict[str, tuple[int, ...]], architecture: str, config: ModelConfig):
        self._tensors = {t.name: t for t in reader.tensors}
        self.shapes = shapes
        heads = {"q": config.num_heads, "k": config.num_kv_heads}
        self._unpermute_heads = (
            {_GGUF_NAMES[r].format(i=i): heads[r] for r in heads for i in range(config.num_layers)}
            if architecture == "llama"
            else {}
        )

    def read(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        w = dequantize(tensor.data, tensor.tensor_type).reshape(self.shapes[name])
        heads = self._unpermute_heads.get(name)
        if heads is not None:
            rows, cols = w.shape
            w = w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
        return w


def _gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _open_gguf(path: Path, dtype: str):
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable GGUF file: {e}") from None
    arch = _gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"unsupported architecture {arch!r} in {path}; supported GGUF architectures: "
            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )

    def need(key):
        value = _gguf_field(reader, f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{path} lacks the GGUF metadata field {arch}.{key}")
        return value

    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    if "rope_freqs.weight" in shapes:
        raise CheckpointError(
            f"{path} uses per-frequency rope scaling (rope_freqs.weight), which is not supported "
            "for GGUF; load the Hugging Face safetensors checkpoint instead"
        )
    scaling = _gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise CheckpointError(f"{path} uses rope scaling {scaling!r}, which is not supported for GGUF")
    if "token_embd.weight" not in shapes:
        raise CheckpointError(f"checkpoint {path} is missing tensor token_embd.weight")
    heads, hidden = need("attention.head_count"), need("embedding_length")
    ffn, layers, eps = need("feed_forward_length"), need("block_count"), need("attention.layer_norm_rms_epsilon")
    experts = {}
    if arch == "qwen3moe":  # every layer sparse; llama.cpp always renormalises the top-k weights
        experts = dict(
            num_experts=int(need("expert_count")),
            num_experts_per_tok=int(need("expert_used_count")),
            moe_intermediate_size=int(need("expert_feed_forward_length")),
            norm_topk_prob=bool(_gguf_field(reader, f"{arch}.expert_weights_norm", True)),
        )
    try:
        config = ModelConfig(
            family=_GGUF_FAMILIES.get(arch, arch),
            vocab_size=shapes["token_embd.weight"][0],
            hidden_size=int(hidden),
            intermediate_size=int(ffn),
            num_layers=int(layers),
            num_heads=int(heads),
            num_kv_heads=int(_gguf_field(reader, f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(_gguf_field(reader, f"{arch}.attention.key_length", hidden // heads)),
            rms_norm_eps=float(eps),
            rope_theta=float(_gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            max_position_embeddings=int(_gguf_field(reader, f"{arch}.context_length", 8192)),
            tie_word_embeddings="output.weight" not in shapes,
            qk_norm=arch in ("qwen3", "qwen3moe"),
            dtype=dtype,
            param_dtype=dtype,
            **experts,
        )
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: unusable GGUF metadata: {e}") from None
    return config, _GGUFCheckpoint(reader, shapes, arch, config)


# -------------------------------------------------------------------- loading


def _check(checkpoint: _Checkpoint, targets: list[_Target], config: ModelConfig, where: Path) -> None:
    """All problems at once: missing tensors, wrong shapes, unexpected tensors."""
    expected: dict[str, tuple[int, ...]] = {}
    for t in targets:
        for i in t.layer_indices(config.num_layers):
            expected.update(checkpoint.tensors(t.role, i, t.stored_shape))
    missing = [n for n in expected if n not in checkpoint.shapes]
    wrong = [
        f"{n} has shape {checkpoint.shapes[n]}, expected {s}"
        for n, s in expected.items()
        if n in checkpoint.shapes and checkpoint.shapes[n] != s
    ]
    extra = sorted(set(checkpoint.shapes) - set(expected) - checkpoint.ignored)

    def listed(items, limit=8):
        more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    problems = []
    if missing:
        problems.append(f"missing tensors: {listed(missing)}")
    if wrong:
        problems.append(f"wrong shapes: {listed(wrong)}")
    if extra:
        problems.append(f"unexpected tensors: {listed(extra)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {where} does not match its {config.family} config "
            f"(layers={config.num_layers}, hidden={config.hidden_size}, heads={config.num_heads}, "
            f"kv_heads={config.num_kv_heads}, head_dim={config.head_dim}, "
            f"tied={config.tie_word_embeddings}"
            + (f", experts={config.num_experts}, sparse layers={sum(config.sparse_layers)}" if config.num_experts else "")
            + "): " + "; ".join(problems)
        )


def place_params(config: ModelConfig, mesh: Mesh, rules: Rules, sources: Mapping[str, Callable[[], np.ndarray]],
                 *, progress: bool = False) -> nnx.Module:
    """The model for ``config`` with every parameter read from the host and placed on its sharding.

    ``sources`` maps each parameter's key path in the model's state, joined by "/" (e.g.
    ``layers/0/attn/q/kernel``), to a function returning its host array; it must name every
    parameter and nothing else. Each array is cast to the parameter dtype, must have the
    parameter's shape, and is read when placed, so one parameter is held on the host at a time.
    Pretrained checkpoints and the bootstrap's cache load through this.
    """
    from spade_jax.progress import progress_bar

    graphdef, state = abstract_model(config)
    shardings = nnx.to_pure_dict(param_shardings(state, mesh, rules))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
    paths = [tuple(getattr(k, "key", getattr(k, "idx", k)) for k in key_path) for key_path, _ in leaves]
    names = ["/".join(map(str, path)) for path in paths]
    if set(sources) != set(names):
        missing, extra = sorted(set(names) - set(sources)), sorted(set(sources) - set(names))
        raise CheckpointError(f"the parameters given do not match the {config.family} model: "
                              f"missing {missing[:8]}, unexpected {extra[:8]}")
    dtype = jnp.dtype(config.param_dtype)
    show = progress and config.num_params * dtype.itemsize >= _PROGRESS_MIN_BYTES
    arrays = []
    with progress_bar(len(leaves), "loading weights", unit="tensor", enabled=show, leave=False) as bar:
        for (_, leaf), path, name in zip(leaves, paths, names):
            host = np.asarray(sources[name](), dtype=dtype)
            if host.shape != tuple(leaf.shape):
                raise CheckpointError(f"parameter {name}: shape {host.shape}, the model wants {tuple(leaf.shape)}")
            arrays.append(jax.make_array_from_callback(host.shape, _lookup(shardings, path), lambda idx, h=host: h[idx]))
            del host
            bar.update()
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, arrays))
    return nnx.merge(graphdef, state)


def _place(checkpoint, targets, config, mesh, rules, progress: bool) -> nnx.Module:
    """Reads, converts and places every checkpoint tensor the targets name."""

    def reader(target, layer):
        return lambda: target.convert(checkpoint.load(target.role, layer, target.stored_shape))

    sources = {"/".join(map(str, path)): reader(t, layer) for t in targets for path, layer in t.paths(config.num_layers)}
    return place_params(config, mesh, rules, sources, progress=progress)


def _lookup(tree: dict, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def load_pretrained(
    path,
    dtype: str = "float32",
    mesh: Mesh | None = None,
    rules: Rules = TRAIN_RULES,
    *,
    param_dtype: str | None = None,
    moe_capacity_factor: float = 0.0,
    tokenizer: bool = True,
    progress: bool = True,
) -> Policy:
    """Loads a pretrained Llama/Qwen3 checkpoint onto `mesh` (default: the first device).

    `path` is a Hugging Face directory (config.json + *.safetensors, sharded or not,
    tokenizer files optional) or a `.gguf` file (dequantised). `dtype` ("float32",
    "bfloat16", or "float64" for exact-arithmetic checks under JAX_ENABLE_X64) is the
    compute dtype and, unless `param_dtype` says otherwise (float32 master weights with
    bfloat16 compute, say), the parameter dtype. `moe_capacity_factor` is the MoE dispatch's
    (0: dropless; see `models/moe.py`), which checkpoints do not carry. With `tokenizer=False`, or for a
    directory without tokenizer files, `policy.tokenizer` is None. Big checkpoints show
    their progress when `progress` is true.
    """
    start = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    dtype = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
    for value in (dtype, param_dtype or dtype):
        if value not in SUPPORTED_DTYPES:
            raise CheckpointError(f"unsupported dtype {value!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
        if value == "float64" and not jax.config.jax_enable_x64:
            raise CheckpointError("dtype float64 needs 64-bit JAX: set JAX_ENABLE_X64=1 before importing jax")
    if path.is_file() and path.suffix == ".gguf":
        config, checkpoint = _open_gguf(path, dtype)
    elif path.is_dir():
        config, checkpoint = _open_hf_directory(path, dtype)
    else:
        raise CheckpointError(
            f"{path} is neither a Hugging Face model directory nor a .gguf file"
        )
    if param_dtype:
        config = config.replace(param_dtype=param_dtype)
    if moe_capacity_factor:
        config = config.replace(moe_capacity_factor=moe_capacity_factor)
    mesh = mesh or make_mesh((1, 1, 1), jax.devices()[:1])
    targets = _targets(config)
    _check(checkpoint, targets, config, path)
    opened = time.perf_counter()
    model = _place(checkpoint, targets, config, mesh, rules, progress)
    placed = time.perf_counter()
    tok = _load_tokenizer(path) if tokenizer else None
    logging.info(
        "loaded %s: %s, %.1fM parameters, %s, mesh %s; open %.1fs, weights %.1fs, tokenizer %.1fs",
        path, config.family, config.num_params / 1e6, dtype, dict(mesh.shape),
        opened - start, placed - opened, time.perf_counter() - placed,
    )
    return Policy(model, config, tok, mesh, rules)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _load_tokenizer(path: Path):
    from spade_jax.models.tokenizer import HFTokenizer

    if path.suffix == ".gguf":
        return HFTokenizer.from_gguf(path)
    if any((path / f).exists() for f in _TOKENIZER_FILES):
        return HFTokenizer.from_pretrained(path)
    logging.info("%s has no tokenizer files; policy.tokenizer is None", path)
    return None
