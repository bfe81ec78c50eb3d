"""The testbed's bootstrap (`spade_jax/bootstrap/testbed.py`) and preset (configs/testbed.py): its config
leaves the seed bootstrap's cache key alone, its data follow the knob distribution, a small build runs."""

import collections
import dataclasses
import random

import numpy as np
import pytest

from spade_jax.bootstrap import build, testbed as tb
from spade_jax.designer.prompts import DIFFICULTIES
from spade_jax.envs import library
from spade_jax.envs.library import testbed

FAMILIES = tuple(env.name for env in testbed.TESTBED_ENVS)
SMALL = dict(families="testbed", envs=FAMILIES, transcripts=3, knob_decay=0.1, num_programs=6, agent_seeds=1,
             vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, head_dim=32, steps=6,
             warmup_steps=2, rows=1, micro_batch_rows=1, row_length=4096, lr=1e-2)


def test_a_seed_config_keeps_the_seed_bootstraps_dict_and_cache_key():
    for fields in ({}, {"steps": 400, "envs": ("shopping", "number_guess", "compass_walk", "repeat_pattern", "knapsack",
                                              "plant_experiment")}):
        ours, theirs = tb.BootstrapConfig(**fields), build.BootstrapConfig(**fields)
        assert ours.to_dict() == theirs.to_dict()
        assert tb.cache_key(ours) == build.cache_key(theirs) and ours.skills == library.SKILLS
    small = tb.BootstrapConfig(**SMALL)
    assert small.to_dict()["families"] == "testbed" and tb.cache_key(small) != build.cache_key(small)
    assert tb.cache_key(dataclasses.replace(small, knob_decay=0.2)) != tb.cache_key(small)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="families must be one of"):
        tb.BootstrapConfig(families="other")
    with pytest.raises(ValueError, match="need families='testbed'"):
        tb.BootstrapConfig(transcripts=10)
    with pytest.raises(ValueError, match="knob_decay must be in"):
        tb.BootstrapConfig(**{**SMALL, "knob_decay": 0.0})
    with pytest.raises(ValueError, match="unknown testbed family"):
        tb.BootstrapConfig(**{**SMALL, "envs": ("bisect", "shopping")})
    with pytest.raises(ValueError, match="rows must be a power of two"):  # the seed bootstrap's own checks
        tb.BootstrapConfig(**{**SMALL, "rows": 3})
    assert tb.BootstrapConfig(**{**SMALL, "envs": ("bisect",)}).skills == ("logical deduction",)


def test_knob_weights_fall_geometrically_to_the_decay():
    np.testing.assert_allclose(tb.knob_weights(3, 0.25), np.array([4, 2, 1]) / 7)
    np.testing.assert_allclose(tb.knob_weights(4, 1.0), np.full(4, 0.25))
    assert tb.knob_weights(1, 0.1).tolist() == [1.0]
    values = tb.sample_knobs("code_lock", 4000, 0.1, np.random.default_rng(0))
    counts = collections.Counter(values)
    trained = testbed.get("code_lock").trained
    assert set(counts) == set(trained)  # the whole trained range, nothing beyond
    expected = 4000 * tb.knob_weights(len(trained), 0.1)
    assert all(abs(counts[v] - e) < 4 * np.sqrt(e) for v, e in zip(trained, expected))


def test_designer_slots_cycle_the_covered_skills_answered_by_a_family_of_each():
    cfg = tb.BootstrapConfig(**SMALL)
    docs = [type("Doc", (), {"as_reference": lambda self, i=i: f"document {i}"})() for i in range(3)]
    slots = tb.designer_slots(24, tb.seeded_memory(cfg.envs), docs, cfg, np.random.default_rng(0))
    assert [s.skill for s in slots[:4]] == list(cfg.skills) and len(cfg.skills) == 4
    assert {(s.skill, s.difficulty) for s in slots} == {(k, d) for k in cfg.skills for d in DIFFICULTIES}
    assert all(testbed.get(s.env).skill == s.skill and s.skill in s.messages[-1]["content"] for s in slots)


def test_renderings_take_the_knob_from_the_difficultys_third_of_the_trained_values():
    keys = [(name, d) for name in FAMILIES for d in DIFFICULTIES]
    programs = tb.render_programs(keys, 30, random.Random(0), 0.7, 0.75)
    assert [(p.name, p.difficulty) for p in programs] == keys * 2
    for p in programs:
        env = testbed.get(p.name)
        third = DIFFICULTIES.index(p.difficulty)
        n = len(env.trained)
        index = env.trained.index(p.knobs[env.knob])
        assert third * n // 3 <= index < max((third + 1) * n // 3, third * n // 3 + 1)
        assert f"\n{env.knob} = {p.knobs[env.knob]}  #" in p.code
        assert testbed.knob_setting(p.code) == (p.name, p.knobs[env.knob])  # a variant keeps class and knob
    again = tb.render_programs(keys, 30, random.Random(0), 0.7, 0.75)
    assert [p.code for p in again] == [p.code for p in programs]


def test_a_small_testbed_bootstrap_builds_caches_and_loads(tmp_path, monkeypatch):
    cfg = tb.BootstrapConfig(**SMALL)
    policy = tb.bootstrap_policy(tmp_path, cfg, progress=False)
    stats = build.bootstrap_stats(tb.cache_path(tmp_path, cfg))
    assert stats["admission"]["admitted"] == stats["admission"]["rendered"] == 6
    assert stats["transcripts"]["knob_won"] == stats["transcripts"]["knob_played"] == 3 * len(FAMILIES)
    assert stats["config"]["families"] == "testbed" and len(stats["loss"]["curve"]) == cfg.steps
    monkeypatch.setattr(tb, "_build", lambda *args: pytest.fail("a cached testbed bootstrap was rebuilt"))
    again = tb.bootstrap_policy(tmp_path, cfg, progress=False)
    tokens = np.asarray([again.tokenizer.encode("class BisectEnv:")], np.int32)
    np.testing.assert_array_equal(again.logits(tokens), policy.logits(tokens))


def test_the_testbed_preset_trains_the_families_and_designs_their_skills():
    from configs import testbed as preset
    from configs import tiny
    from spade_jax.selfplay.config import bootstrap_config, validate

    for arg in (None, "runlocal"):
        config = preset.get_config(arg)
        validate(config, num_devices=1)
        boot = bootstrap_config(config)
        assert boot.families == "testbed" and boot.envs == FAMILIES and boot.knob_decay < 1 and boot.transcripts > 0
        assert tuple(config.designer.skills) == boot.skills and not config.memory.seed_library
        assert config.agent.system_prompt == "" and config.agent.user_template == "{observation}"
        assert config.agent.max_turns == (2 if arg else boot.agent_max_turns)
        spec = config.eval.suites
        assert spec.startswith("envs:") and {p.rsplit("/", 1)[1][:-3] for p in spec[5:].split(",")} == set(FAMILIES)
    seed = bootstrap_config(tiny.get_config())
    assert seed.families == "seed" and tb.cache_key(seed) == build.cache_key(
        build.BootstrapConfig(**{f.name: getattr(seed, f.name) for f in dataclasses.fields(build.BootstrapConfig)}))
