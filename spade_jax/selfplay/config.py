"""The self-play config: defaults every preset starts from, validation, and the stage views.

Presets in `configs/` call `base_config()` and override fields; `validate` runs before
any work and stops with one message naming the field to fix. Each stage receives its
own small frozen dataclass built here, so stages never read the ConfigDict.
"""

from __future__ import annotations

import math

import ml_collections

from spade_jax.envs.library import SKILLS

MODEL_SOURCES = ("bootstrap", "pretrained", "random")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_iterations = 10

    c.model = ml_collections.ConfigDict()
    c.model.source = "pretrained"  # bootstrap | pretrained | random
    c.model.path = ""  # pretrained: HF directory or .gguf file; "packaged" = the pip-packaged SmolLM2
    c.model.dtype = "float32"
    c.model.param_dtype = "float32"
    c.model.tokenizer_path = ""  # random: a HF directory or .gguf whose tokenizer to use
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

    c.corpus = ml_collections.ConfigDict(
        dict(paths=(), name="", split="train", data_dir="", text_key="text", id_key="", max_words=6000)
    )

    c.designer = ml_collections.ConfigDict(
        dict(
            num_slots=8,
            skills=SKILLS,
            skills_per_regeneration=6,
            difficulties=("easy", "medium", "hard"),
            max_new_tokens=2048,
            temperature=1.0,
            top_p=1.0,
            n_positive=2,
            n_negative=1,
            regeneration_period=1,  # design new environments every N iterations; play the pool between
            reward_delay=0,  # iterations of play whose episodes count towards the designer's reward
            self_review=False,
            review_max_new_tokens=8,
        )
    )
    c.designer.reward = ml_collections.ConfigDict(
        dict(
            kind="blend",
            regret_weight=0.4,
            regret_scale=0.15,
            plateau_weight=0.6,
            plateau_low=0.4,
            plateau_high=0.6,
            plateau_ramp=0.25,
            failure_penalty=-1.0,
        )
    )

    c.admission = ml_collections.ConfigDict(
        dict(
            num_seeds=3,
            novelty_threshold=0.85,
            reward_min=-1.0,
            reward_max=1.0,
            random_plays=8,
            max_random_win_rate=0.5,
            pause_s=1.0,
            time_budget_s=30.0,
        )
    )

    c.sandbox = ml_collections.ConfigDict(
        dict(
            num_workers=2,
            isolation="auto",
            load_timeout_s=10.0,
            call_timeout_s=5.0,
            cpu_seconds=120,
            memory_mb=1024,
            episode_time_s=120.0,
            pool_memory_mb=4096,
            pool_processes=4096,
        )
    )

    c.memory = ml_collections.ConfigDict(
        dict(capacity=200, staleness_decay=0.95, max_code_lines=80, max_code_chars=4000, seed_library=True)
    )

    c.hints = ml_collections.ConfigDict(dict(mode="self", max_new_tokens=96, temperature=0.7))

    c.agent = ml_collections.ConfigDict(
        dict(
            episodes_per_env=16,
            max_turns=8,
            max_new_tokens=512,
            context_budget=4096,
            temperature=1.0,
            top_p=1.0,
            timeout_penalty=-0.5,
            train_hinted=False,
            regret_weighting=False,
            regret_temperature=1.0,
            replay_envs=0,  # environments replayed from memory each iteration besides the new pool
        )
    )

    c.rl = ml_collections.ConfigDict(
        dict(
            lr=1e-6,
            weight_decay=0.1,
            b1=0.9,
            b2=0.98,
            grad_clip=1.0,
            warmup_steps=0,
            eps_low=0.2,
            eps_high=0.28,
            tis_cap=2.0,
            kl_coef=0.0,
            designer_weight=1.0,
            agent_weight=1.0,
            row_length=4096,
            micro_batch_rows=0,
            updates_per_iteration=1,
        )
    )

    c.checkpoint = ml_collections.ConfigDict(dict(every=1, keep=3, async_save=True))
    c.log = ml_collections.ConfigDict(dict(gallery=True, progress=True))
    return c


def _fail(field: str, message: str) -> None:
    raise ValueError(f"config.{field}: {message}")


def validate(c: ml_collections.ConfigDict, num_devices: int) -> None:
    """Stops with one clear message for a config that makes no sense on `num_devices` devices."""
    if c.num_iterations < 0:
        _fail("num_iterations", f"must be >= 0, got {c.num_iterations}")
    if c.model.source not in MODEL_SOURCES:
        _fail("model.source", f"must be one of {MODEL_SOURCES}, got {c.model.source!r}")
    if c.model.source == "pretrained" and not c.model.path:
        _fail("model.path", "model.source='pretrained' needs a path (HF directory, .gguf file, or 'packaged')")
    if c.model.source == "bootstrap":
        _validate_bootstrap(c)
    for field in ("dtype", "param_dtype"):
        if c.model[field] not in ("float32", "bfloat16"):
            _fail(f"model.{field}", f"must be float32 or bfloat16, got {c.model[field]!r}")
    shape = tuple(c.mesh.shape)
    if len(shape) != 3 or any((s < 1 and s != -1) for s in shape) or shape.count(-1) > 1:
        _fail("mesh.shape", f"must be 3 positive sizes (data, fsdp, tensor) with at most one -1, got {shape}")
    known = math.prod(s for s in shape if s != -1)
    if (-1 in shape and num_devices % known) or (-1 not in shape and known != num_devices):
        _fail("mesh.shape", f"{shape} does not fit the {num_devices} available devices")
    unknown = sorted(set(c.designer.skills) - set(SKILLS))
    if unknown:
        _fail("designer.skills", f"unknown skills {unknown}; choose from {list(SKILLS)}")
    for field in ("num_slots", "skills_per_regeneration", "max_new_tokens", "regeneration_period"):
        if c.designer[field] < 1:
            _fail(f"designer.{field}", f"must be >= 1, got {c.designer[field]}")
    if c.designer.reward_delay < 0:
        _fail("designer.reward_delay", f"must be >= 0, got {c.designer.reward_delay}")
    if c.designer.reward_delay >= c.designer.regeneration_period and c.designer.regeneration_period > 1:
        _fail(
            "designer.reward_delay",
            f"must be < designer.regeneration_period ({c.designer.regeneration_period}): "
            "an environment only stays in the pool for one period",
        )
    if c.agent.episodes_per_env < 1:
        _fail("agent.episodes_per_env", f"must be >= 1, got {c.agent.episodes_per_env}")
    if c.agent.max_new_tokens >= c.agent.context_budget:
        _fail("agent.context_budget", f"must exceed agent.max_new_tokens ({c.agent.max_new_tokens})")
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
    from spade_jax.selfplay import setup

    builders = [
        ("designer", setup.designer_config), ("admission", setup.admission_config), ("agent", setup.agent_config),
        ("hints", setup.hint_config), ("designer.reward", setup.reward_config), ("sandbox", setup.sandbox_config),
        ("rl", setup.optim_config), ("rl", setup.loss_config),
    ]
    for section, build in builders:
        try:
            build(c)
        except (TypeError, ValueError) as err:
            _fail(section, str(err))


def _validate_bootstrap(c: ml_collections.ConfigDict) -> None:
    """The bootstrap's own checks, and the designer prompt sizes it was trained on."""
    from spade_jax.selfplay.setup import bootstrap_config

    boot = bootstrap_config(c)
    trained_on = {
        "corpus.max_words": ("doc_max_words", c.corpus.max_words),
        "designer.n_positive": ("exemplars_positive", c.designer.n_positive),
        "designer.n_negative": ("exemplars_negative", c.designer.n_negative),
        "memory.max_code_lines": ("exemplar_max_lines", c.memory.max_code_lines),
        "memory.max_code_chars": ("exemplar_max_chars", c.memory.max_code_chars),
    }
    for field, (boot_field, value) in trained_on.items():
        if value != getattr(boot, boot_field):
            _fail(field, f"is {value} but the bootstrap was trained on bootstrap.{boot_field}="
                         f"{getattr(boot, boot_field)}; set both to the same value")


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
