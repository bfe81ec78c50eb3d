"""The self-play config: defaults every preset starts from, validation, and the stage views.

Presets in `configs/` call `base_config()` and override fields; `validate` runs before
any work and stops with one message naming the field to fix. Each stage receives its
own small frozen dataclass (`designer_config`, `agent_config`, ...), so stages never read
the ConfigDict. A stage's section is made from its dataclass (`section`) and read back
into it (`from_section`, both in `sections.py`): each default is written once, in the
dataclass, and every field of it can be set from the command line. The loop's own knobs (how
many episodes, replays, weights) are written here, beside the stage fields of the same
section. A side system's section is its component's (`components.SECTIONS`), added here.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections
from ml_collections import config_dict

from spade_jax.admission import AdmissionConfig
from spade_jax.agent import AgentConfig, HintConfig
from spade_jax.agent.scripted import PLAYERS, ScriptedConfig
from spade_jax.bootstrap import BootstrapConfig
from spade_jax.designer.corpus import CorpusConfig
from spade_jax.designer.memory import RETIRED_SETTINGS, EnvironmentMemory, RotationConfig
from spade_jax.designer.prompts import PromptConfig
from spade_jax.designer.review import ReviewConfig
from spade_jax.designer.rollout import DesignerConfig
from spade_jax.envs.library import SEED_ENVS, SKILLS
from spade_jax.evals.registry import registered
from spade_jax.evals.runner import EvalConfig
from spade_jax.evals.suite import GenerationSettings
from spade_jax.models.sampling_weights import SAMPLING_DTYPES
from spade_jax.rl.rewards import DesignerRewardConfig
from spade_jax.rl.train import LossConfig, OptimConfig
from spade_jax.sandbox import SandboxConfig
from spade_jax.selfplay.components import SECTIONS
from spade_jax.selfplay.sections import field_defaults, from_section, section

MODEL_SOURCES = ("bootstrap", "pretrained", "random")
# Retired switches: field -> (the value that meant today's rule, the
# last commit that had the switch). A run saved with another value is refused on resume (`main`);
# docs/DESIGN.md lists them.
RETIRED = {
    "designer.reward.win_rate": ("mean_reward", "36594a1"),
    "designer.reward.regret_plays": ("regeneration", "36594a1"),
    "designer.reward.matched_seeds": (False, "36594a1"),
    "designer.reward.blend_without_delay": (False, "36594a1"),
    "designer.reward.lone_skill_to_batch_mean": (False, "36594a1"),
    **{f"memory.{name}": value for name, value in RETIRED_SETTINGS.items()},
    "agent.step_error_reward": (-1.0, "3d0cdfd"),
    "agent.step_cut_replies": (False, "3d0cdfd"),
    "agent.score_timeouts": (False, "3d0cdfd"),
    "agent.score_failed_starts": (False, "3d0cdfd"),
    "agent.hinted_like_plain": (False, "3d0cdfd"),
    "hints.max_sentences": (0, "e332701"),
    "hints.max_code_chars": (0, "e332701"),
    "designer.prompt.exemplar_max_lines": (0, "08dd458"),
    "designer.prompt.exemplar_cut_marked": (False, "08dd458"),
    "designer.prompt.exemplar_layout": ("reference", "08dd458"),
}


def reference_recipe(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The published training recipe's schedule and sampling (spade-rl/spade,
    `cmd/games/train_spade_{4b,8b,30b}.sh`) on top of the base config's reference rules: a new
    pool every 4 iterations with the designer trained 4 later (blend reward, auto scale), 24
    designer slots over 3 of the 6 skills per regeneration (8 a skill), a failed slot designed
    again up to 5 attempts, 8 plain plays per environment a rollout (global batch 192 / 24
    games) and 16 hinted plays at its regeneration step, up to 25 turns, environments
    designed and played at temperature 0.6, hints written at 0.3 with 4096 tokens (the hint
    defaults). Returns ``c``, edited."""
    c.designer.regeneration_period = 4
    c.designer.reward_delay = 4
    c.designer.reward.kind = "blend"
    c.designer.reward.scaling = "auto"
    c.designer.num_slots = 24
    c.designer.skills_per_regeneration = 3
    c.designer.max_attempts = 5
    c.designer.temperature = 0.6
    c.agent.temperature = 0.6
    c.agent.episodes_per_env = 8
    c.agent.hinted_episodes_per_env = 16
    c.agent.max_turns = 25
    c.hints.mode = "self"
    c.hints.temperature = 0.3
    c.hints.max_new_tokens = 4096
    return c


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_iterations = 10
    # > 0: the run also ends once the agent has generated this many tokens (plain and hinted
    # plays); the iteration that reaches it is evaluated. Equal agent compute across ablations.
    c.agent_token_budget = 0
    # Persistent XLA compilation cache (`spade_jax.compile_cache`): "" = <workdir>/xla_cache,
    # "none" = off, a path = a cache several runs and entry points share.
    c.compile_cache_dir = ""

    c.model = ml_collections.ConfigDict()
    c.model.source = "pretrained"  # bootstrap | pretrained | random
    c.model.path = ""  # pretrained: HF directory or .gguf file; "packaged" = the pip-packaged SmolLM2
    c.model.dtype = "float32"
    c.model.param_dtype = "float32"
    # The weights the samplers read (models/sampling_weights.py): "auto" = a bfloat16 copy of the
    # masters, cast after each update, on GPU/TPU and the masters themselves on CPU; "float32" or
    # "bfloat16" force one. Training always reads the masters (`param_dtype`).
    c.model.sampling_dtype = "auto"
    c.model.tokenizer_path = ""  # random: a HF directory or .gguf whose tokenizer to use
    c.model.moe_capacity_factor = 0.0  # MoE checkpoints: 0 = dropless dispatch (models/moe.py)
    c.model.arch = ml_collections.ConfigDict(
        dict(
            family="llama",
            vocab_size=0,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
        )
    )

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the remaining devices

    # Document truncation is `designer.prompt.doc_max_words`; the sampling order follows `seed`.
    # `enabled=False`: designer prompts without a document (the no-corpus ablation).
    c.corpus = section(CorpusConfig, exclude=("max_words", "seed"), enabled=True)
    c.designer = section(
        DesignerConfig,
        enabled=True,  # False: no designer at all; the agent plays `agent.replay_envs` environments of memory
        train=True,  # False: the designer designs and is scored, but its tokens are not trained (frozen designer)
        regeneration_period=1,  # design new environments every N iterations; play the pool between
        # Iterations after its design at which a design is scored and trained, 0..regeneration_period
        # (the reference's proposer training delay): 0 scores it on its own iteration's plays, d > 0
        # at iteration d + delay on the plays of the iterations between. The reference's default is
        # 0; its recipe regenerates every 4 and delays by 4.
        reward_delay=0,
        self_review=False,
        review=ReviewConfig(),
        reward=DesignerRewardConfig(),
    )
    # The maximum number of turns is the agent's (`agent.max_turns`); the sandbox is `sandbox`.
    c.admission = section(AdmissionConfig, exclude=("max_turns", "sandbox"))
    c.sandbox = section(SandboxConfig)
    # `enabled=False`: designer prompts without exemplars, novelty against the batch only (no-memory
    # ablation); the memory still records environments, which the agent replays. `heldout`: seed
    # programs left out of memory (never replayed, shown or compared against: kept for evaluation).
    # `retire_*`: rotation of mastered records out of replay (`RotationConfig`).
    c.memory = section(EnvironmentMemory, seed_library=True, enabled=True, heldout=())
    c.memory.update(section(RotationConfig))
    c.hints = section(HintConfig)
    # Plays per environment as the reference sizes them: `episodes_per_env` plain plays every
    # iteration (its global batch / games: 192 / 24 = 8), and `hinted_episodes_per_env` hinted
    # plays of a new design at its regeneration step (`--spade-hint-plays-per-game 16`).
    c.agent = section(
        AgentConfig,
        episodes_per_env=8,
        hinted_episodes_per_env=16,
        train_hinted=False,
        regret_weighting=False,
        regret_temperature=1.0,
        replay_envs=0,  # environments replayed from memory each iteration besides the new pool
        # Who plays: "policy" (the method), or for studies of the designer alone "scripted", a
        # player of each program's own solution whose frontier is known (`agent/scripted.py`).
        player="policy",
        scripted=ScriptedConfig(),
    )
    c.rl = section(OptimConfig)
    c.rl.update(section(LossConfig, exclude=("objective",)))
    # A role's loss weight; 0 freezes it (its sequences are not packed, see `scoring`).
    c.rl.update(dict(designer_weight=1.0, agent_weight=1.0, row_length=4096, updates_per_iteration=1))

    # Held-out evaluation (`spade_jax.evals`): which suites, how often; per-suite sampling in
    # `eval.generation.<prefix>` (dashes in a prefix become underscores).

    c.eval = section(EvalConfig, exclude=("admission",), seed=config_dict.placeholder(int))  # unset: `seed`
    c.eval.generation = ml_collections.ConfigDict(
        {prefix.replace("-", "_"): section(GenerationSettings, **dataclasses.asdict(entry.settings))
         for prefix, entry in registered().items()}
    )

    c.checkpoint = ml_collections.ConfigDict(dict(every=1, keep=3, async_save=True))
    c.log = ml_collections.ConfigDict(dict(gallery=True, progress=True))
    # The side systems' own sections (`calibration`, `agent.procedure_memory`, `trajectories`),
    # each written beside its component (`selfplay/components/`).
    for side in SECTIONS:
        *parents, name = side.path.split(".")
        parent = c
        for part in parents:
            parent = parent[part]
        parent[name] = side.make()
    c.lock()  # a preset that sets a field that does not exist fails (`with c.unlocked():` adds sections)
    return c


# ---- the stage views ----------------------------------------------------------------------


def prompt_config(c) -> PromptConfig:
    return from_section(PromptConfig, c.designer.prompt)


def designer_config(c) -> DesignerConfig:
    return from_section(DesignerConfig, c.designer)


def review_config(c) -> ReviewConfig:
    return from_section(ReviewConfig, c.designer.review)


def reward_config(c) -> DesignerRewardConfig:
    return from_section(DesignerRewardConfig, c.designer.reward)


def sandbox_config(c) -> SandboxConfig:
    return from_section(SandboxConfig, c.sandbox)


def admission_config(c) -> AdmissionConfig:
    return from_section(AdmissionConfig, c.admission, max_turns=c.agent.max_turns, sandbox=sandbox_config(c))


def agent_config(c) -> AgentConfig:
    return from_section(AgentConfig, c.agent)


def scripted_config(c) -> ScriptedConfig:
    return from_section(ScriptedConfig, c.agent.scripted)


def hint_config(c) -> HintConfig:
    return from_section(HintConfig, c.hints)


def corpus_config(c) -> CorpusConfig:
    return from_section(CorpusConfig, c.corpus, max_words=c.designer.prompt.doc_max_words, seed=c.seed)


def memory(c) -> EnvironmentMemory:
    """An empty environment memory as `config.memory` describes it (seeds are added by the loop)."""
    return from_section(EnvironmentMemory, c.memory)


def rotation_config(c) -> RotationConfig:
    return from_section(RotationConfig, c.memory)


def optim_config(c) -> OptimConfig:
    return from_section(OptimConfig, c.rl)


def loss_config(c) -> LossConfig:
    return from_section(LossConfig, c.rl, objective="pg")


def eval_config(c) -> EvalConfig:
    """`config.eval`, its seed the run's `seed` unless `eval.seed` is set."""
    seed = c.seed if c.eval.seed is None else c.eval.seed
    return from_section(EvalConfig, c.eval, admission=admission_config(c), seed=seed)


def eval_generation(c) -> dict[str, GenerationSettings]:
    """Each registered suite's generation settings, by suite prefix."""
    return {prefix: from_section(GenerationSettings, c.eval.generation[prefix.replace("-", "_")])
            for prefix in registered() if prefix.replace("-", "_") in c.eval.generation}


def bootstrap_config(c) -> BootstrapConfig:
    """`config.bootstrap` (less `cache_dir`) with the run's designer prompt; ValueError names a bad field."""
    if "bootstrap" not in c:
        raise ValueError("config.bootstrap: model.source='bootstrap' needs a bootstrap section (see configs/tiny.py)")
    unknown = sorted(set(c.bootstrap) - set(field_defaults(BootstrapConfig)) - {"cache_dir", "prompt"})
    if unknown:
        raise ValueError(f"config.bootstrap: unknown field(s) {unknown}")
    try:
        return from_section(BootstrapConfig, c.bootstrap, prompt=prompt_config(c))
    except (TypeError, ValueError) as err:
        raise ValueError(f"config.bootstrap: {err}") from None


_STAGES = (
    ("designer", designer_config), ("designer.prompt", prompt_config), ("designer.review", review_config),
    ("designer.reward", reward_config), ("admission", admission_config), ("sandbox", sandbox_config),
    ("agent", agent_config), ("agent.scripted", scripted_config), ("hints", hint_config),
    ("corpus", corpus_config), ("memory", memory), ("memory", rotation_config),
    ("rl", optim_config), ("rl", loss_config), ("eval", eval_config), ("eval.generation", eval_generation),
    *((side.path, side.read) for side in SECTIONS),
)


def _fail(field: str, message: str) -> None:
    raise ValueError(f"config.{field}: {message}")


def validate(c: ml_collections.ConfigDict, num_devices: int) -> None:
    """Stops with one clear message for a config that makes no sense on `num_devices` devices."""
    if c.num_iterations < 0:
        _fail("num_iterations", f"must be >= 0, got {c.num_iterations}")
    if c.agent_token_budget < 0:
        _fail("agent_token_budget", f"must be >= 0 (0: no budget), got {c.agent_token_budget}")
    if c.model.source not in MODEL_SOURCES:
        _fail("model.source", f"must be one of {MODEL_SOURCES}, got {c.model.source!r}")
    if c.model.source == "pretrained" and not c.model.path:
        _fail("model.path", "model.source='pretrained' needs a path (HF directory, .gguf file, or 'packaged')")
    if c.model.source == "bootstrap":
        bootstrap_config(c)
    for field in ("dtype", "param_dtype"):
        if c.model[field] not in ("float32", "bfloat16"):
            _fail(f"model.{field}", f"must be float32 or bfloat16, got {c.model[field]!r}")
    if c.model.sampling_dtype not in SAMPLING_DTYPES:
        _fail("model.sampling_dtype", f"must be one of {SAMPLING_DTYPES}, got {c.model.sampling_dtype!r}")
    shape = tuple(c.mesh.shape)
    if len(shape) != 3 or any((s < 1 and s != -1) for s in shape) or shape.count(-1) > 1:
        _fail("mesh.shape", f"must be 3 positive sizes (data, fsdp, tensor) with at most one -1, got {shape}")
    known = math.prod(s for s in shape if s != -1)
    if (-1 in shape and num_devices % known) or (-1 not in shape and known != num_devices):
        _fail("mesh.shape", f"{shape} does not fit the {num_devices} available devices")
    unknown_envs = sorted(set(c.memory.heldout) - {env.name for env in SEED_ENVS})
    if unknown_envs:
        _fail("memory.heldout", f"unknown seed programs {unknown_envs}; choose from {[e.name for e in SEED_ENVS]}")
    unknown = sorted(set(c.designer.skills) - set(SKILLS))
    if unknown:
        _fail("designer.skills", f"unknown skills {unknown}; choose from {list(SKILLS)}")
    for field in ("num_slots", "skills_per_regeneration", "max_new_tokens", "regeneration_period"):
        if c.designer[field] < 1:
            _fail(f"designer.{field}", f"must be >= 1, got {c.designer[field]}")
    if not 0 <= c.designer.reward_delay <= c.designer.regeneration_period:
        _fail(
            "designer.reward_delay",
            f"must lie in 0..designer.regeneration_period ({c.designer.regeneration_period}), got "
            f"{c.designer.reward_delay}: a design is scored on the plays of the pool it made, which "
            "leaves the pool after one period",
        )
    if not c.designer.enabled and c.agent.replay_envs < 1:
        _fail("agent.replay_envs", "must be >= 1 when designer.enabled is False (the agent only replays memory)")
    if c.agent.episodes_per_env < 1:
        _fail("agent.episodes_per_env", f"must be >= 1, got {c.agent.episodes_per_env}")
    if c.agent.hinted_episodes_per_env < 1:
        _fail("agent.hinted_episodes_per_env", f"must be >= 1, got {c.agent.hinted_episodes_per_env}")
    if c.agent.player not in PLAYERS:
        _fail("agent.player", f"must be one of {PLAYERS}, got {c.agent.player!r}")
    if c.designer.max_attempts < 1:
        _fail("designer.max_attempts", f"must be >= 1, got {c.designer.max_attempts}")
    if c.rl.row_length < c.agent.context_budget:
        _fail("rl.row_length", f"must be >= agent.context_budget ({c.agent.context_budget}) so episodes fit a row")
    if c.rl.updates_per_iteration < 1:
        _fail("rl.updates_per_iteration", f"must be >= 1, got {c.rl.updates_per_iteration}")
    if c.checkpoint.every < 1 or c.checkpoint.keep < 1:
        _fail("checkpoint", "every and keep must be >= 1")
    data_parallel = shape[0] * shape[1] if -1 not in shape[:2] else num_devices // max(1, shape[2])
    if c.rl.micro_batch_rows and c.rl.micro_batch_rows % data_parallel:
        _fail(
            "rl.micro_batch_rows",
            f"{c.rl.micro_batch_rows} is not divisible by the data-parallel size {data_parallel} (mesh data x fsdp)",
        )
    _validate_stage_configs(c)


def _validate_stage_configs(c: ml_collections.ConfigDict) -> None:
    """Builds every stage's config, so their own checks also run before any work."""
    for field, build in _STAGES:
        try:
            build(c)
        except (TypeError, ValueError) as err:
            _fail(field, str(err))


def parse_arg(arg: str | None, **defaults):
    """big_vision-style preset arguments: `--config=configs/x.py:runlocal,slots=4` -> ConfigDict.

    Each `key=value` (or bare `key`, meaning True) must name one of `defaults`; values take
    the default's type.
    """
    out = ml_collections.ConfigDict(defaults)
    for part in filter(None, (arg or "").split(",")):
        key, _, value = part.partition("=")
        if key not in defaults:
            raise ValueError(f"unknown preset argument {key!r}; known: {sorted(defaults)}")
        default = defaults[key]
        if not value:
            out[key] = True
        elif isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = type(default)(value)
    return out
