"""The testbed families (`spade_jax/envs/library/testbed/`): registry, solutions at every knob value
and level, plays that must not win, and sandbox admission as the designer's programs are admitted."""

import itertools
import re
from pathlib import Path

import pytest

from spade_jax.envs import library
from spade_jax.envs.contract import SUCCESS_REWARD
from spade_jax.envs.library import testbed

FAMILIES = [env.name for env in testbed.TESTBED_ENVS]
SEEDS = range(6)
NOOP_ACTIONS = ["", "   ", "I do not know.", "\\boxed{}", "\\boxed{ }", "\\boxed{-1}", "\\boxed{abc}", "boxed{1}",
                "<answer>1</answer>"]


def _env_class(source):
    namespace = {"__name__": "testbed_env"}
    exec(compile(source, "testbed_env", "exec"), namespace)
    (cls,) = [v for k, v in namespace.items() if k.endswith("Env") and isinstance(v, type)
              and v.__module__ == "testbed_env"]
    return cls


def _play(env, actions):
    """Plays ``actions`` until the episode ends; returns (won, steps taken)."""
    for step, action in enumerate(actions, 1):
        _, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return terminated and reward == SUCCESS_REWARD, step
    return False, len(actions)


def test_registry_knobs_levels_and_skills():
    assert len(set(FAMILIES)) == len(FAMILIES) >= 4
    assert {env.skill for env in testbed.TESTBED_ENVS} <= set(library.SKILLS)
    assert set(testbed.SKILLS) == {env.skill for env in testbed.TESTBED_ENVS}
    assert not set(FAMILIES) & {env.name for env in library.SEED_ENVS}
    kinds = set()
    for env in testbed.TESTBED_ENVS:
        assert env.allowed[:len(env.trained)] == env.trained and len(env.allowed) == len(env.trained) + 2
        assert list(env.allowed) == sorted(set(env.allowed)) and len(env.trained) >= 5
        assert env.knobs == {env.knob: env.allowed}
        levels = testbed.level_values(env.name)
        assert list(levels) == ["easy", "medium", "hard"] and all(v in env.trained for v in levels.values())
        assert levels["easy"] < levels["medium"] < levels["hard"]
        assert testbed.default_knob(env.name) in env.allowed
        source = testbed.load_source(env.name)
        assert f'DIFFICULTY_LEVELS = "easy", "medium", "hard"' in source and "def solution(self)" in source
        kinds.add("multi-turn" if "Kind: game (multi-turn)" in source else "one answer")
    assert kinds == {"multi-turn", "one answer"}


def test_render_sets_the_one_knob_and_refuses_values_outside_the_grid():
    env = testbed.get("code_lock")
    assert "\nLENGTH = 9  #" in testbed.render("code_lock", 9)
    assert testbed.render("code_lock") == testbed.load_source("code_lock")
    for bad in (env.allowed[-1] + 1, 3.0, "4"):
        with pytest.raises(ValueError, match="code_lock.LENGTH"):
            testbed.render("code_lock", bad)
    with pytest.raises(ValueError, match="unknown testbed family"):
        testbed.get("nope")


def test_knob_setting_reads_the_family_and_value_of_a_rendering():
    for env in testbed.TESTBED_ENVS:
        assert testbed.knob_setting(testbed.render(env.name, env.allowed[-1])) == (env.name, env.allowed[-1])
    assert testbed.knob_setting(library.load_source("number_guess")) is None
    renamed = testbed.render("bisect", 24).replace("class BisectEnv", "class GuessEnv")
    assert testbed.knob_setting(renamed) is None


@pytest.mark.parametrize("name", FAMILIES)
def test_solution_wins_at_every_knob_value_and_level_within_the_preset_turns(name):
    max_turns = 12  # configs/testbed.py: the bootstrap's agent_max_turns
    cases = [(value, None) for value in testbed.get(name).allowed] + [(None, level) for level in
                                                                       ("easy", "medium", "hard")]
    for value, level in cases:
        cls = _env_class(testbed.render(name, value))
        for seed in SEEDS:
            env = cls(max_turns=max_turns, difficulty=level)
            first, _ = env.reset(seed=seed)
            assert isinstance(first, str) and first == cls(max_turns=max_turns, difficulty=level).reset(seed=seed)[0]
            actions = env.solution().splitlines()
            won, steps = _play(env, actions)
            assert won and steps == len(actions) <= max_turns, (name, value, level, seed)


@pytest.mark.parametrize("name", FAMILIES)
def test_noop_and_malformed_actions_never_win_and_cost_a_turn(name):
    cls = _env_class(testbed.load_source(name))
    for seed, action in itertools.product(SEEDS, NOOP_ACTIONS):
        env = cls(max_turns=12)
        env.reset(seed=seed)
        _, reward, terminated, truncated, _ = env.step(action)
        assert reward == 0.0 and not terminated and env.turn == 1, (name, seed, action)
    env = cls(max_turns=3)
    env.reset(seed=0)
    assert _play(env, ["\\boxed{}"] * 5) == (False, 3)  # truncated at max_turns


@pytest.mark.parametrize("name", FAMILIES)
def test_a_fixed_answer_does_not_win_most_seeds(name):
    # Admission's blind stage, in process: the first move of one seed's solution, repeated, on 32 others.
    for value in testbed.get(name).trained[:2] + testbed.get(name).trained[-1:]:
        cls = _env_class(testbed.render(name, value))
        env = cls(max_turns=12)
        env.reset(seed=999)
        answer = env.solution().splitlines()[0]
        wins = 0
        for seed in range(32):
            env = cls(max_turns=12)
            env.reset(seed=seed)
            wins += _play(env, [answer] * 4)[0]
        assert wins <= 16, (name, value, answer, wins)


def test_every_family_passes_admission_at_its_lowest_and_highest_knob():
    admission = pytest.importorskip("spade_jax.admission")
    from spade_jax.sandbox import SandboxPool
    from spade_jax.admission.similarity import code_similarity

    cases = [(env.name, value) for env in testbed.TESTBED_ENVS for value in (env.trained[0], env.allowed[-1])]
    config = admission.AdmissionConfig(batch_novelty=False, max_turns=12)  # renderings of one game are alike
    archive = [library.load_source(env.name) for env in library.SEED_ENVS]  # novel against the seed library
    pool = SandboxPool(config.sandbox)
    try:
        reports = admission.admit_batch([testbed.render(*case) for case in cases], config, archive=archive, pool=pool)
    finally:
        pool.close_all()
    assert [(case, r.stage, r.reason) for case, r in zip(cases, reports) if not r.admitted] == []
    pairs = itertools.combinations([testbed.load_source(name) for name in FAMILIES], 2)
    assert max(code_similarity(a, b) for a, b in pairs) < config.novelty_threshold


def test_readme_table_matches_the_testbed_registry():
    readme = (Path(library.__file__).parent / "README.md").read_text().split("\n## Testbed families")[1]
    rows = re.findall(r"^\| (\w+) \| ([a-z ]+) \| game[^|]* \| (\w+): ([^|(]+) \(([^)]+)\) \|", readme, re.MULTILINE)
    table = {name: (skill, knob, trained.strip(), beyond) for name, skill, knob, trained, beyond in rows}

    def values(vs):
        return f"{vs[0]}..{vs[-1]}" if vs == tuple(range(vs[0], vs[-1] + 1)) else ", ".join(map(str, vs))

    expected = {env.name: (env.skill, env.knob, values(env.trained), ", ".join(map(str, env.allowed[len(env.trained):])))
                for env in testbed.TESTBED_ENVS}
    assert table == expected
