"""The designer's recipe mechanics against the reference's (spade-rl/spade): generation retries,
skill groups that hold several designs, plays per environment as it sizes them, and control
arms that pack what the method packs.

* `core/orchestrator.py` `_generate_single_game_async` (1032-1202) and `corpus_orchestrator.py`
  (63-226): a slot whose program fails is generated again from a fresh prompt (a fresh
  document, fresh memory exemplars), up to ``max_attempts`` (the Slime rollout passes 5,
  `slime/spade_rollout.py`:487); only the attempt that passes is returned and trained;
* `generate_games_async` (1405-1490): slots take the regeneration's skills round-robin,
  ``skills[i % len(skills)]``, so 24 games over 3 skills give each skill a group of 8;
* `spade_rollout.py`:446-451 and the recipe's `--spade-hint-plays-per-game 16`: each game is
  played ``global_batch_size // rollout_batch_size`` = 192 // 24 = 8 times plain a rollout,
  and 16 times hinted at its regeneration step;
* `spade_rollout.py`:658-661: only ``proposer_masked`` designer samples are filtered; a sample
  whose centred reward is 0 is trained like any other (it adds to the token mean);
* `_play_game_with_hint_async` (1880-1887): a hinted play whose step times out scores 0 and
  flags its game for the step-timeout penalty.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from configs import qwen3_4b, tiny
from spade_jax.admission import AdmissionReport
from spade_jax.agent import play_episodes
from spade_jax.designer.rollout import DesignerConfig, DesignSample, assign_slots
from spade_jax.envs import library
from spade_jax.selfplay import config as config_lib
from spade_jax.selfplay import loop


GOOD = library.load_source("arithmetic")


def _proposer(failures: dict[int, int], log: list):
    """A designer that writes a broken program for slot s on its first ``failures[s]`` attempts and
    a working one after; every call's (attempt, slots, seed) goes to ``log``."""

    def propose(policy, memory, corpus, cfg, *, seed, slots=None, attempt=0):
        log.append((attempt, sorted(slots), seed))
        return [DesignSample(slot=s, skill=skill, difficulty=difficulty, doc_id=None, doc_excerpt="",
                             prompt_tokens=np.array([1, 2], np.int32), tokens=np.array([3, 4, 5 + s], np.int32),
                             logprobs=np.zeros(3, np.float32),
                             text="broken" if attempt < failures.get(s, 0) else GOOD, attempt=attempt)
                for s, (skill, difficulty) in slots.items()]

    return propose


def _admit(samples, pool, memory, admission, seed=None, earlier=()):
    return [dataclasses.replace(s, report=AdmissionReport(s.text == GOOD, "novelty" if s.text == GOOD else "parse",
                                                          "", code=s.text)) for s in samples]


@pytest.fixture
def recorded_run(tmp_path, random_selfplay, canned_sampler, small_tokenizer, monkeypatch):
    """``recorded_run(failures, configure=None)``: one iteration with the designer on; returns the
    run's metrics, the designer's calls, the sequences of its update, the requests it played."""
    answer = canned_sampler(small_tokenizer.encode("\\boxed{1}"))

    def run(failures, configure=None):
        log, updates, played = [], [], []
        monkeypatch.setattr(loop, "propose", _proposer(failures, log))
        monkeypatch.setattr(loop, "admit_samples", _admit)

        def play(policy, pool, requests, cfg, **kwargs):
            played.extend(requests)
            return play_episodes(policy, pool, requests, cfg, sample=answer, **kwargs)

        monkeypatch.setattr(loop, "play_episodes", play)
        monkeypatch.setattr(loop.SelfPlay, "_update", lambda self, sequences: updates.append(sequences) or {})

        def configure_all(c):
            c.num_iterations = 1
            c.designer.enabled = True
            c.designer.num_slots = 4
            c.designer.skills_per_regeneration = 2
            c.agent.replay_envs = 0
            c.hints.mode = "solution"
            c.checkpoint.every = 100
            if configure:
                configure(c)

        selfplay = random_selfplay(tmp_path / f"run{len(list(tmp_path.iterdir()))}", configure_all)
        try:
            (metrics,) = selfplay.run()
        finally:
            selfplay.close()
        return metrics, log, updates[0], played

    return run


def test_a_failed_slot_is_designed_again_and_only_the_admitted_attempt_trains(recorded_run):
    # slot 0 passes at once, slot 1 on its 3rd attempt, slot 2 never within 5, slot 3 on its 2nd
    metrics, log, sequences, _ = recorded_run({1: 2, 2: 99, 3: 1})
    assert [(attempt, slots) for attempt, slots, _ in log] == [
        (0, [0, 1, 2, 3]), (1, [1, 2, 3]), (2, [1, 2]), (3, [2]), (4, [2])]
    assert len({seed for _, _, seed in log}) == 5  # each attempt samples from a fresh prompt
    designer = [s for s in sequences if s.role == "designer"]
    # the admitted attempts of slots 0, 1 and 3 train; slot 2's five failures and the failed
    # earlier attempts of slots 1 and 3 never do
    assert sorted(int(s.tokens[-1]) for s in designer) == [5, 6, 8]
    assert metrics["designer/proposed"] == 4 and metrics["designer/admitted"] == 3
    assert metrics["designer/admission_rate"] == 0.75  # per slot, not per attempt
    assert metrics["designer/attempts"] == 4 + 3 + 2 + 1 + 1 == 11
    assert metrics["designer/attempt_admission_rate"] == pytest.approx(3 / 11)
    assert metrics["designer/attempt_tokens"] == 3 * 11
    assert metrics["designer/rejected/parse"] == 8


def test_max_attempts_one_is_a_single_attempt(recorded_run):
    metrics, log, sequences, _ = recorded_run({1: 2}, lambda c: setattr(c.designer, "max_attempts", 1))
    assert [attempt for attempt, _, _ in log] == [0] and metrics["designer/admitted"] == 3


def test_slots_take_the_skills_round_robin_so_every_skill_holds_a_group():
    """24 slots over 3 skills: 8 a skill (the recipe); the defaults and the presets hold groups of
    several designs, never a skill alone (whose centred advantage would always be 0)."""
    rng = np.random.default_rng(0)
    recipe = config_lib.designer_config(config_lib.reference_recipe(config_lib.base_config()))
    assert recipe.max_attempts == 5
    assert sorted(Counter(s for s, _ in assign_slots(recipe, rng)).values()) == [8, 8, 8]
    presets = {"default": config_lib.base_config(), "tiny": tiny.get_config(), "qwen3_4b": qwen3_4b.get_config(),
               "tiny:runlocal": tiny.get_config("runlocal")}
    for name, c in presets.items():
        sizes = Counter(s for s, _ in assign_slots(config_lib.designer_config(c), rng)).values()
        assert min(sizes) >= 2, (name, sorted(sizes))
    assert DesignerConfig().max_attempts == 5


def test_plays_per_environment_are_sized_as_the_reference_sizes_them(recorded_run):
    """The recipe: 8 plain plays per environment per iteration, 16 hinted at the regeneration step."""
    recipe = config_lib.reference_recipe(config_lib.base_config())
    assert (recipe.agent.episodes_per_env, recipe.agent.hinted_episodes_per_env) == (8, 16)
    base = config_lib.base_config()
    assert (base.agent.episodes_per_env, base.agent.hinted_episodes_per_env) == (8, 16)

    def sized(c):
        c.agent.episodes_per_env, c.agent.hinted_episodes_per_env = 2, 3
        c.designer.num_slots = 2

    _, _, _, played = recorded_run({}, sized)
    per_env = Counter((r.env_key, r.hinted) for r in played)
    assert per_env == {(0, False): 2, (0, True): 3, (1, False): 2, (1, True): 3}


def test_the_frozen_designer_packs_the_designer_tokens_with_advantage_zero(recorded_run):
    """The control differs from the method in the designer's gradient only: the same designer
    sequences enter the update (the same token mean), each with advantage 0."""
    trained = lambda c: setattr(c.designer.reward, "scaling", "none")
    frozen = lambda c: (trained(c), setattr(c.designer, "train", False))
    m_method, _, method, _ = recorded_run({}, trained)
    m_frozen, _, control, _ = recorded_run({}, frozen)
    designer = lambda seqs: [s for s in seqs if s.role == "designer"]
    assert [s.tokens.tolist() for s in designer(control)] == [s.tokens.tolist() for s in designer(method)]
    assert len(designer(control)) == 4 and all(s.advantage == 0.0 for s in designer(control))
    assert sum(int(s.loss_mask.sum()) for s in control) == sum(int(s.loss_mask.sum()) for s in method)
    assert m_frozen["designer/trained"] == m_method["designer/trained"] == 4


def test_a_hinted_play_that_times_out_flags_its_environment(recorded_run, monkeypatch):
    """The hinted play scores 0 and stays among the hinted plays; its environment gets the step-
    timeout penalty (-0.5) where the reward kind applies it: the undelayed regret path."""

    def configure(c):
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1
        c.designer.reward.kind = "regret"
        c.designer.reward.scaling = "none"
        inner = loop.play_episodes

        def hinted_times_out(*args, **kwargs):
            return [dataclasses.replace(t, end_reason="timeout", reward=0.0, won=False)
                    if t.hinted and t.request.env_key == 0 else t for t in inner(*args, **kwargs)]

        monkeypatch.setattr(loop, "play_episodes", hinted_times_out)

    metrics, _, sequences, _ = recorded_run({}, configure)
    assert metrics["agent/episodes"] == 2 * (2 + 16)  # the timed-out hinted plays are kept
    designer = sorted((s for s in sequences if s.role == "designer"), key=lambda s: int(s.tokens[-1]))
    # slot 0 timed out: raw reward -0.5; slot 1's regret is 0 (the same canned answer either way)
    np.testing.assert_allclose([s.advantage for s in designer], [-0.25, 0.25])
