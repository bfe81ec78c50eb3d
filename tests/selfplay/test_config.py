"""Presets load and validate; nonsense stops before any work with one message naming the field."""

import subprocess
import sys
from pathlib import Path

import pytest

from experiments import presets
from spade_jax.selfplay.config import validate

REPO = Path(__file__).resolve().parents[2]
PRESETS = ["tiny", "smollm2_135m", "qwen3_0p6b", "qwen3_4b", "qwen3_8b", "qwen3_30b_a3b"]
# Devices each preset is validated on: the 30B preset's mesh fixes fsdp at 8 (16 experts each).
DEVICES = {"qwen3_30b_a3b": (8, 32)}


def _preset(name: str, arg: str | None = None):
    module = presets.module(name)
    assert module.__doc__ and "python -m spade_jax.main" in module.__doc__  # the run command
    return presets.load(f"{name}:{arg}" if arg else name)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("arg", [None, "runlocal"])
def test_every_preset_validates(name, arg):
    config = _preset(name, arg)
    if config.model.source == "pretrained" and not config.model.path:
        config.model.path = "/path/given/by/the/user"
    for devices in DEVICES.get(name, (1, 8)):
        validate(config, num_devices=devices)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda c: setattr(c.mesh, "shape", (3, 1, 1)), "mesh.shape"),
        (lambda c: setattr(c.mesh, "shape", (2, -1, -1)), "mesh.shape"),
        (lambda c: setattr(c.rl, "micro_batch_rows", 3), "rl.micro_batch_rows"),
        (lambda c: setattr(c.model, "source", "downloaded"), "model.source"),
        (lambda c: setattr(c.model, "sampling_dtype", "float16"), "model.sampling_dtype"),
        (lambda c: setattr(c.designer, "skills", ("juggling",)), "designer.skills"),
        (lambda c: setattr(c.agent, "context_budget", 16), "agent: context_budget"),
        (lambda c: setattr(c.agent, "rows", 0), "agent: rows"),
        (lambda c: setattr(c.agent, "refill_fraction", 0.0), "agent: refill_fraction"),
        (lambda c: setattr(c.designer, "reward_delay", 5), "designer.reward_delay"),
        (lambda c: setattr(c.designer, "reward_delay", -1), "designer.reward_delay"),
        (lambda c: setattr(c.memory, "heldout", ("chess",)), "memory.heldout"),
        (lambda c: setattr(c.designer.prompt, "doc_max_words", 0), "doc_max_words"),
        (lambda c: setattr(c.hints, "mode", "psychic"), "hints"),
        (lambda c: setattr(c.bootstrap, "rows", 6), "bootstrap"),
        (lambda c: setattr(c.bootstrap, "typo_field", 1), "typo_field"),
    ],
)
def test_nonsense_fails_with_one_message_naming_the_field(change, field):
    config = _preset("tiny")
    config.designer.regeneration_period = 2
    config.rl.micro_batch_rows = 4
    with config.unlocked():
        change(config)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(config, num_devices=2)


def _main(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade_jax.main", *flags], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--config.rl.no_such_field=1", "no_such_field"),
        ("--config.rl.lr=fast", "rl.lr"),
        ("--config.mesh.shape=(4,1,1)", "does not fit the 1 available devices"),
    ],
)
def test_main_stops_before_any_work_on_a_bad_flag(tmp_path, flag, message):
    workdir = tmp_path / "run"
    result = _main("--config=configs/tiny.py", f"--workdir={workdir}", flag)
    assert result.returncode != 0
    if "renamed" in message or "fit" in message:  # the project's own checks: a usage error
        assert result.returncode == 2
    assert message in result.stderr + result.stdout
    assert not workdir.exists()  # nothing was written, nothing was trained


def test_each_stage_dataclass_is_its_config_section():
    """Every field of a stage's dataclass is a field of its section with the dataclass's default
    (the default is written once), and a value set in the section reaches the stage."""
    import dataclasses

    from spade_jax.selfplay import config as config_lib

    c = config_lib.base_config()
    excluded = {"admission": {"max_turns", "sandbox"}, "corpus": {"max_words", "seed"}, "rl": {"objective"}, "eval": {"admission"},
                "trajectories": {"seed"}}
    for field, build in config_lib._STAGES:
        built = build(c)
        if not dataclasses.is_dataclass(built):  # the memory (a class) and the per-suite settings (a dict)
            continue
        section = c
        for part in field.split("."):
            section = section[part]
        for f in dataclasses.fields(built):
            if f.name in excluded.get(field, ()):
                continue
            assert f.name in section, f"{field}.{f.name} cannot be set from the config"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert getattr(built, f.name) == default, (field, f.name)
    c.agent.top_k = 5
    c.hints.top_p = 0.9
    c.designer.prompt.exemplar_max_chars = 123
    c.sandbox.host_uid = 1234
    assert config_lib.agent_config(c).top_k == 5 and config_lib.hint_config(c).top_p == 0.9
    assert config_lib.designer_config(c).prompt.exemplar_max_chars == 123
    assert config_lib.admission_config(c).sandbox.host_uid == 1234


def test_the_bootstrap_trains_on_the_designer_prompt():
    config = _preset("tiny")
    config.designer.prompt.doc_max_words = 55
    from spade_jax.selfplay.config import bootstrap_config, designer_config

    assert bootstrap_config(config).prompt == designer_config(config).prompt
    assert bootstrap_config(config).prompt.doc_max_words == 55


def test_a_preset_cannot_set_a_field_that_does_not_exist():
    from spade_jax.selfplay.config import base_config

    c = base_config()
    with pytest.raises(AttributeError):
        c.corpus.max_words = 300  # the document size is designer.prompt.doc_max_words
    c.designer.prompt.doc_max_words = 300


@pytest.mark.parametrize("period, delay, ok", [(4, 4, True), (4, 0, True), (1, 1, True), (1, 0, True), (1, 2, False),
                                              (4, 5, False), (4, -1, False)])
def test_reward_delay_counts_iterations_after_the_design_as_the_reference_does(period, delay, ok):
    config = _preset("tiny")
    config.designer.regeneration_period, config.designer.reward_delay = period, delay
    config.rl.micro_batch_rows = 4
    if ok:
        validate(config, num_devices=2)
    else:
        with pytest.raises(ValueError, match=r"designer\.reward_delay"):
            validate(config, num_devices=2)


def test_tiny_holds_out_the_seed_programs_its_bootstrap_does_not_render():
    from spade_jax.envs import library
    from spade_jax.selfplay import config as config_lib

    config = _preset("tiny")
    rendered = set(config.bootstrap.envs)
    assert set(config.memory.heldout) == {e.name for e in library.SEED_ENVS} - rendered and config.eval.every == 5
    (spec,) = config_lib.eval_config(config).specs
    assert spec.startswith("envs:") and {p.rsplit("/", 1)[1][:-3] for p in spec[5:].split(",")} == set(config.memory.heldout)
