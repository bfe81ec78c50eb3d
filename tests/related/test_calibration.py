"""Difficulty calibration (EvoEnv): the contract's difficulty knob, the seed library's levels, the
calibration stage with scripted agents, pool rotation, and calibration inside the self-play loop."""

import ast
import dataclasses
import json
import re
import types

import numpy as np
import pytest

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.agent import AgentConfig
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.related.calibration import calibrate as calibration
from spade_jax.related.calibration.calibrate import CalibrationConfig, calibrate, choose_level, replay_solutions
from spade_jax.sampling import Generation, GenerationStats
from spade_jax.sandbox import EpisodeSpec, SandboxConfig, SandboxPool
from spade_jax.sandbox.policy import PolicyError, difficulty_levels
from spade_jax.seeds import derive_seed
from spade_jax.selfplay import config as config_lib
from spade_jax.selfplay import loop
from spade_jax.selfplay.components import PHASES

# The secret is shown at "easy", on even seeds at "medium" (the default), never outright at
# "hard": an agent that reads "The secret is N" solves easy always, medium on even seeds, hard
# never; solution() always wins. Where it is not shown outright the observation gives it plus
# one, so solution() is a play (admission rejects one that reads state the agent cannot see).
PEEK_ENV = r'''
import random
from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class PeekEnv:
    DIFFICULTY_LEVELS = ("easy", "medium", "hard")

    def __init__(self, max_turns=1, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.difficulty = difficulty or "medium"

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(100, 999)
        shown = self.difficulty == "easy" or (self.difficulty == "medium" and seed % 2 == 0)
        clue = "The secret is %d. " if shown else "The secret plus one is %d. "
        return clue % (self.secret + (0 if shown else 1)) + "Answer in \\boxed{}.", {}

    def step(self, action):
        won = extract_boxed(action) == str(self.secret)
        return ("Right." if won else "Wrong."), (SUCCESS_REWARD if won else 0.0), True, False, {}

    def solution(self):
        return "\\boxed{%d}" % self.secret
'''
# No levels, and the secret is always shown: the agent always wins, so no level is in band.
SHOWN_ENV = (PEEK_ENV.replace('    DIFFICULTY_LEVELS = ("easy", "medium", "hard")\n\n', "")
             .replace('difficulty or "medium"', '"easy"'))
AGENT = AgentConfig(max_turns=1, max_new_tokens=16, context_budget=512)


def peek_sample(policy, prompts, *, max_new_tokens, seed, **unused):
    """A scripted agent: answers the secret when the observation shows it, else guesses 0."""
    tok = policy.tokenizer
    rows = []
    for prompt in prompts:
        found = re.search(r"The secret is (\d+)", tok.decode(prompt))
        reply = "\\boxed{%s}" % (found.group(1) if found else "0")
        rows.append(tok.encode(reply)[: max_new_tokens - 1] + [tok.eos_token_ids[0]])
    width = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return Generation(tokens=tokens, logprobs=np.zeros(tokens.shape, np.float32),
                      lengths=np.array([len(r) for r in rows], np.int32), finished=np.ones(len(rows), bool),
                      stats=GenerationStats(compile_s=0.0, prefill_s=0.0, decode_s=0.0, steps=width,
                                            bucket=(len(rows), 0, width)))


def _even_seeds(seed: int, n: int) -> int:
    return sum(derive_seed(seed, j) % EPISODE_SEED_SPACE % 2 == 0 for j in range(n))


# A calibration seed whose 4 episode seeds are neither all even nor all odd: medium's rate is in (0, 1).
MIXED_SEED = next(s for s in range(100) if 0 < _even_seeds(s, 4) < 4)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2)) as p:
        yield p


# --- the contract's knob -----------------------------------------------------------------------


def test_difficulty_levels_reads_literal_tuples_and_refuses_anything_else():
    assert difficulty_levels(PEEK_ENV) == ("easy", "medium", "hard")
    assert difficulty_levels(SHOWN_ENV) == ()
    declared = PEEK_ENV.replace('("easy", "medium", "hard")', "VALUE")
    for value, message in [("tuple(LEVELS)", "literal tuple"), ('("easy", 2)', "string literal"),
                           ('("easy", "easy")', "distinct"), ("()", "1..8"), ('("a b",)', "string literal"),
                           (repr(tuple(f"l{i}" for i in range(9))), "1..8")]:
        with pytest.raises(PolicyError, match=message):
            difficulty_levels(declared.replace("VALUE", value))


def test_admission_plays_every_level_and_rejects_a_malformed_declaration(pool):
    broken_hard = PEEK_ENV.replace("        self.secret = random", "        assert self.difficulty != 'hard'\n"
                                                                    "        self.secret = random")
    malformed = PEEK_ENV.replace('("easy", "medium", "hard")', '["easy", "hard"]')
    reports = admit_batch([PEEK_ENV, broken_hard, malformed], AdmissionConfig(batch_novelty=False, pause_s=0.0),
                          pool=pool, seed=3)
    good, hard, bad = reports
    assert good.admitted and good.details["difficulty_levels"] == ["easy", "medium", "hard"]
    assert not hard.admitted and hard.stage == "contract" and "difficulty='hard'" in hard.reason
    assert not bad.admitted and bad.stage == "contract" and "DIFFICULTY_LEVELS must be a literal tuple" in bad.reason


# --- the seed library --------------------------------------------------------------------------


def _levels_table(name: str) -> tuple[tuple[str, ...], dict]:
    """(knob names in the order the level tuples set them, LEVELS) read from the program's syntax tree."""
    tree = ast.parse(library.load_source(name))
    table = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "LEVELS")
    knobs = next(tuple(n.names) for n in ast.walk(tree) if isinstance(n, ast.Global))
    return knobs, {level: v if isinstance(v, tuple) else (v,) for level, v in table.items()}


# Knobs where a smaller value is harder (fewer terms shown before the missing one).
_HARDER_WHEN_SMALLER = {("sequence", "SHOWN_TERMS")}


@pytest.mark.parametrize("env", library.SEED_ENVS, ids=lambda env: env.name)
def test_seed_program_declares_levels_within_its_knob_ranges_and_hard_is_harder(env):
    assert difficulty_levels(library.load_source(env.name)) == ("easy", "medium", "hard")
    knobs, table = _levels_table(env.name)
    assert set(knobs) == set(env.knobs) and set(table) == {"easy", "medium", "hard"}
    for values in table.values():
        assert all(v in env.knobs[k] for k, v in zip(knobs, values))
    signs = [-1 if (env.name, k) in _HARDER_WHEN_SMALLER else 1 for k in knobs]
    steps = [[s * (b - a) for s, a, b in zip(signs, table[lo], table[hi])]
             for lo, hi in (("easy", "medium"), ("medium", "hard"))]
    assert all(min(step) >= 0 and max(step) > 0 for step in steps), table


def test_every_level_of_every_seed_program_starts_and_its_solution_wins(pool):
    cases = [(env.name, level, seed) for env in library.SEED_ENVS for level in ("easy", "medium", "hard")
             for seed in (11, 12)]
    specs = [EpisodeSpec(library.load_source(name), seed=seed, env_kwargs={"difficulty": level})
             for name, level, seed in cases]
    starts = pool.start(specs)
    pool.close([s.episode_id for s in starts])
    assert all(s.ok for s in starts), [(c, s.error) for c, s in zip(cases, starts) if not s.ok]
    won = replay_solutions(pool, specs)
    assert all(won), [c for c, w in zip(cases, won) if not w]


# --- the calibration stage ---------------------------------------------------------------------


def test_choose_level_takes_the_hardest_verified_level_in_band():
    levels = ("easy", "medium", "hard", "expert")
    index, reason = choose_level(levels, (1.0, 0.5, 0.25, 0.25), (1.0, 1.0, 1.0, 0.75), (0.125, 0.75))
    assert index == 2  # medium and hard are in band; expert too, but its solution loses on a seed
    assert reason == ("level 'hard' in band [0.125, 0.75]: agent easy 1.00 (solution 1.00), medium 0.50 "
                      "(solution 1.00), hard 0.25 (solution 1.00), expert 0.25 (solution 0.75)")
    index, reason = choose_level((None,), (0.0,), (1.0,), (0.125, 0.75))
    assert index is None and reason == "no verified level in band [0.125, 0.75]: agent default 0.00 (solution 1.00)"
    assert choose_level((None,), (0.75,), (1.0,), (0.125, 0.75))[0] == 0  # the band is inclusive


def test_calibration_picks_the_in_band_level_and_rejects_an_out_of_band_program(pool, small_tokenizer):
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    peek, shown = calibrate(policy, pool, [PEEK_ENV, SHOWN_ENV], AGENT, CalibrationConfig(seeds_per_level=4),
                            seed=MIXED_SEED, sample=peek_sample)
    medium = _even_seeds(MIXED_SEED, 4) / 4
    assert peek.levels == (None, "easy", "medium", "hard")  # the default (PEEK_ENV's is medium) plays too
    assert peek.agent_rates == (medium, 1.0, medium, 0.0) and peek.solution_rates == (1.0, 1.0, 1.0, 1.0)
    assert peek.admitted and peek.level == "medium"  # a declared level in band is preferred to the default
    assert peek.gaps == (1.0 - medium, 0.0, 1.0 - medium, 1.0) and peek.gap == 1.0 - medium
    assert peek.reason.startswith(f"level 'medium' in band [0.125, 0.75]: agent default {medium:.2f} (solution "
                                  f"1.00), easy 1.00 (solution 1.00), medium {medium:.2f} (solution 1.00), hard 0.00")
    assert peek.episodes == 2 * 4 * 4
    assert shown.levels == (None,) and not shown.admitted and shown.level is None and shown.gap is None
    assert shown.reason == "no verified level in band [0.125, 0.75]: agent default 1.00 (solution 1.00)"
    assert json.loads(json.dumps(peek.to_dict()))["gap"] == [1.0 - medium, 0.0, 1.0 - medium, 1.0]


def test_calibration_can_choose_the_default_level(pool, small_tokenizer):
    """Only the default is in band (the declared levels show the secret always or never): the
    program is admitted at its default level, which calibration used never to play."""
    only_default = PEEK_ENV.replace('("easy", "medium", "hard")', '("easy", "hard")')
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    (result,) = calibrate(policy, pool, [only_default], AGENT, CalibrationConfig(seeds_per_level=4),
                          seed=MIXED_SEED, sample=peek_sample)
    medium = _even_seeds(MIXED_SEED, 4) / 4
    assert result.levels == (None, "easy", "hard") and result.agent_rates == (medium, 1.0, 0.0)
    assert result.admitted and result.level is None and result.gap == 1.0 - medium
    assert result.reason.startswith("level 'default' in band")


def test_calibration_config_is_validated_through_the_run_config():
    c = config_lib.base_config()
    c.model.source = "random"
    c.calibration.band = (0.8, 0.2)
    with pytest.raises(ValueError, match=r"config\.calibration: band must be an ordered pair"):
        config_lib.validate(c, 1)
    c.calibration.band = (0.1, 0.9)
    c.memory.retire_win_rate = 1.0
    with pytest.raises(ValueError, match=r"config\.memory: retire_win_rate"):
        config_lib.validate(c, 1)


# --- pool rotation and memory state ------------------------------------------------------------


def _memory_with_plays() -> EnvironmentMemory:
    memory = EnvironmentMemory()
    memory.add(PEEK_ENV, "logical deduction", iteration=0, env_id="mastered", level="hard", plain_wins=[0, 0])
    memory.update("mastered", iteration=1, win_rate=0.9, mean_plain=0.9, mean_hinted=1.0, regret=0.1,
                  plain_wins=[1, 1, 1, 0, 1, 1, 1, 1])
    memory.add(PEEK_ENV, "logical deduction", iteration=0, env_id="at-threshold", plain_wins=[1, 1, 0, 0] * 2)
    memory.add(PEEK_ENV, "logical deduction", iteration=0, env_id="few-plays", plain_wins=[1] * 7)
    memory.add_seed(library.load_source("arithmetic"), "mathematical reasoning", name="arithmetic")
    memory.get("seed-arithmetic").record_plays([1] * 8)
    return memory


def test_rotation_retires_mastered_records_and_replays_skip_them():
    memory = _memory_with_plays()
    assert memory.retire_mastered(4, 0.5, 8) == ["mastered", "seed-arithmetic"]  # 0.5 is not > 0.5; 7 plays < 8
    record = memory.get("mastered")
    assert record.retired_iteration == 4
    assert record.retired_reason == "mastered: plain win rate 0.88 over the last 8 plays > 0.5"
    assert memory.retire_mastered(5, 0.5, 8) == []  # retired once
    fake = types.SimpleNamespace(config=types.SimpleNamespace(seed=0, agent=types.SimpleNamespace(replay_envs=10)),
                                 state=types.SimpleNamespace(pool=[]), memory=memory,
                                 context=types.SimpleNamespace(seed=lambda it, phase: derive_seed(0, it, PHASES[phase])))
    replays = loop.SelfPlay._replays(fake, 6)
    assert [e.env_id for e in replays] == ["at-threshold", "few-plays"]
    memory.get("at-threshold").level = "medium"
    assert [e.difficulty for e in loop.SelfPlay._replays(fake, 6)] == ["medium", None]


def test_memory_state_round_trips_the_new_fields_and_loads_old_states():
    memory = _memory_with_plays()
    memory.retire_mastered(4, 0.5, 8)
    state = json.loads(json.dumps(memory.to_state()))
    again = EnvironmentMemory.from_state(state)
    assert [dataclasses.asdict(r) for r in again.records()] == [dataclasses.asdict(r) for r in memory.records()]
    assert again.get("mastered").level == "hard" and again.get("mastered").recent_plain[-3:] == [1, 1, 1]
    new_fields = ("level", "recent_plain", "retired_iteration", "retired_reason")
    for raw in state["records"]:
        for field in new_fields:
            raw.pop(field)
    old = EnvironmentMemory.from_state(state)
    assert all(r.level is None and r.recent_plain == [] and not r.retired for r in old.records())


# --- inside the loop ---------------------------------------------------------------------------


def test_the_loop_calibrates_new_designs_plays_them_at_their_level_and_rejects_the_rest(
        tmp_path, small_tokenizer, monkeypatch):
    from spade_jax.admission import AdmissionReport
    from tests.selfplay.test_selfplay import _run_loop, run_log, tiny_selfplay_config

    c = tiny_selfplay_config()
    c.agent.replay_envs = 0
    c.agent.max_turns = 1  # one attempt per slot (tiny_selfplay_config): slot 1 is rejected once
    c.hints.mode = "resample"  # hinted plays whatever the random policy would write as a hint
    c.calibration.enabled = True
    c.memory.retire_win_rate = 0.5
    c.seed = next(s for s in range(100) if 0 < _even_seeds(derive_seed(s, 0, PHASES["calibration"]), 4) < 4)
    calibration_seed = derive_seed(c.seed, 0, PHASES["calibration"])

    def admit(samples, pool, memory, admission, seed=None, earlier=()):  # slot 0 writes PEEK_ENV, slot 1 SHOWN_ENV
        return [dataclasses.replace(s, report=AdmissionReport(True, "novelty", "", code=(PEEK_ENV, SHOWN_ENV)[s.slot]))
                for s in samples]

    real_play = calibration.play_episodes
    monkeypatch.setattr(loop, "admit_samples", admit)
    monkeypatch.setattr(calibration, "play_episodes",
                        lambda *args, sample=None, **kwargs: real_play(*args, sample=peek_sample, **kwargs))
    (metrics,), run = _run_loop(c, tmp_path, small_tokenizer)
    assert metrics["designer/admitted"] == 1 and metrics["designer/rejected/calibration"] == 1
    assert metrics["calibration/episodes"] == 2 * (4 + 1) * 4 and metrics["time/calibration_s"] > 0
    medium = _even_seeds(calibration_seed, 4) / 4
    assert metrics["calibration/agent_solve_rate_mean"] == pytest.approx((medium + 1.0 + medium + 0.0 + 1.0) / 5)
    assert metrics["calibration/solve_verify_gap_mean"] == pytest.approx(
        ((1 - medium) + 0.0 + (1 - medium) + 1.0 + 0.0) / 5)
    assert metrics["agent/episodes"] == 4  # the admitted design only: 2 plain + 2 hinted
    assert metrics["memory/retired"] == 0  # the tiny random agent wins nothing
    assert run.memory.get("it0000-slot00").level == "medium"
    entries = {e.slot: e for e in run_log(tmp_path) if e.slot is not None}
    assert entries[0].level == "medium" and entries[0].calibration["level"] == "medium"
    assert not entries[1].admitted and entries[1].stage == "calibration"
    assert entries[1].reason.startswith("no verified level in band")
    page = (tmp_path / "gallery" / "envs" / "env-it0000-slot00.html").read_text()
    assert "level played</dt><dd>medium" in page and "<b>medium</b>" in page


def test_a_program_whose_levels_cannot_be_read_is_rejected_unplayed():
    (result,) = calibrate(None, None, ["X = " + "+".join(["1"] * 40000)], AGENT, CalibrationConfig(), seed=0)
    assert not result.admitted and result.episodes == 0 and "cannot read its difficulty levels" in result.reason
