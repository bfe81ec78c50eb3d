"""The scripted player of studies (`agent/scripted.py`): it plays a program's own solution in the
sandbox, finishing it with a probability that falls with the solution's length; the environment
decides every outcome."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spade_jax.admission import AdmissionReport
from spade_jax.agent import AgentConfig, EpisodeRequest
from spade_jax.agent.scripted import ScriptedConfig, play_scripted, solution_actions
from spade_jax.envs import library
from spade_jax.designer.rollout import DesignSample
from spade_jax.sandbox import EpisodeSpec, SandboxConfig, SandboxPool
from spade_jax.selfplay import loop

AGENT = AgentConfig(max_turns=8, max_new_tokens=32, context_budget=1024)
SHOPPING = library.load_source("shopping")  # NUM_ITEMS lookups, then the answer

# A program whose solution() looks like a plan but never wins: the environment has the last word.
LYING = '''
class LyingEnv:
    def __init__(self, max_turns=4, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything, three times.", {}

    def step(self, action):
        return "No.", 0.0, False, False, {}

    def solution(self):
        return "\\\\boxed{a}\\n\\\\boxed{b}\\n\\\\boxed{c}"
'''


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2)) as p:
        yield p


def _length(pool, program, seed=3):
    (start,) = pool.start([EpisodeSpec(program, seed, 8)])
    (solution,) = pool.solution([start.episode_id])
    pool.close([start.episode_id])
    return len(solution_actions(solution))


def test_the_finish_probability_falls_with_length_and_regret_peaks_at_the_frontier():
    cfg = ScriptedConfig(budget=2.5, hinted_budget=4.5, width=0.5)
    plain = [cfg.finish_probability(n, False) for n in range(1, 9)]
    assert all(a > b for a, b in zip(plain, plain[1:]))
    assert cfg.finish_probability(2.5, False) == 0.5 and cfg.finish_probability(4.5, True) == 0.5
    assert cfg.finish_probability(3, False) == pytest.approx(1 / (1 + math.exp(1.0)))
    regret = {n: cfg.finish_probability(n, True) - cfg.finish_probability(n, False) for n in range(1, 9)}
    assert cfg.frontier() == 3.5 and max(regret, key=regret.get) in (3, 4)
    with pytest.raises(ValueError, match="hinted_budget"):
        ScriptedConfig(budget=3, hinted_budget=2)


def test_a_finished_solution_wins_through_the_sandbox_and_an_unfinished_one_scores_zero(pool):
    length = _length(pool, SHOPPING)
    assert length >= 2
    sure, never = ScriptedConfig(budget=50, hinted_budget=50), ScriptedConfig(budget=-50, hinted_budget=-50)
    requests = [EpisodeRequest(0, SHOPPING, seed=3), EpisodeRequest(0, SHOPPING, seed=3, hinted=True)]
    won = play_scripted(pool, requests, AGENT, sure, seed=0)
    assert [(t.won, t.reward, t.turns, t.end_reason) for t in won] == [(True, 1.0, length, "terminated")] * 2
    assert won[0].tokens.size == 0 and not won[0].loss_mask.any()  # the agent trains nothing
    assert won[0].messages[0]["role"] == "user" and len(won[0].messages) == 1 + 2 * length
    lost = play_scripted(pool, requests, AGENT, never, seed=0)
    assert [(t.won, t.reward, t.turns) for t in lost] == [(False, 0.0, length - 1)] * 2


def test_hinted_plays_have_the_larger_budget_and_the_draws_follow_the_probability(pool):
    length = _length(pool, SHOPPING)
    cfg = ScriptedConfig(budget=length - 0.5, hinted_budget=length + 0.5, width=0.5)  # p = 0.27, 0.73
    requests = [EpisodeRequest(0, SHOPPING, seed=s, hinted=h) for s in range(40) for h in (False, True)]
    out = play_scripted(pool, requests, AGENT, cfg, seed=1)
    plain = np.mean([t.won for t in out if not t.hinted])
    hinted = np.mean([t.won for t in out if t.hinted])
    assert 0.1 <= plain <= 0.45 and 0.55 <= hinted <= 0.9 and hinted > plain
    again = play_scripted(pool, requests, AGENT, cfg, seed=1)
    assert [t.won for t in again] == [t.won for t in out]  # the draws come from the seed


def test_the_environment_decides_the_outcome(pool):
    (t,) = play_scripted(pool, [EpisodeRequest(0, LYING, seed=0)], AGENT, ScriptedConfig(50, 50), seed=0)
    assert not t.won and t.reward == 0.0 and t.turns == 3


def test_a_program_that_fails_to_start_is_dropped_when_plain(pool):
    broken = "raise RuntimeError('no')\n"
    plain, hinted = play_scripted(pool, [EpisodeRequest(0, broken, seed=0), EpisodeRequest(0, broken, seed=0,
                                                                                          hinted=True)],
                                  AGENT, ScriptedConfig(), seed=0)
    assert plain.dropped and not hinted.dropped and hinted.reward == 0.0


def test_in_the_loop_the_scripted_player_pays_the_designer_at_its_frontier(tmp_path, random_selfplay, monkeypatch):
    """`agent.player="scripted"`: the designs are played by the scripted player (no agent tokens
    in the update) and the design nearest the frontier earns the larger advantage."""
    import dataclasses

    near, far = library.render("shopping", {"NUM_ITEMS": 2}), library.render("shopping", {"NUM_ITEMS": 5})

    def propose(policy, memory, corpus, cfg, *, seed, slots, attempt=0):
        return [DesignSample(slot=s, skill=skill, difficulty=d, doc_id=None, doc_excerpt="",
                             prompt_tokens=np.array([1, 2], np.int32), tokens=np.array([3, 4 + s], np.int32),
                             logprobs=np.zeros(2, np.float32), text=(near, far)[s], attempt=attempt)
                for s, (skill, d) in slots.items()]

    def admit(samples, pool, memory, admission, seed=None, earlier=()):
        return [dataclasses.replace(s, report=AdmissionReport(True, "novelty", "", code=s.text)) for s in samples]

    updates = []
    monkeypatch.setattr(loop, "propose", propose)
    monkeypatch.setattr(loop, "admit_samples", admit)
    monkeypatch.setattr(loop.SelfPlay, "_update", lambda self, sequences: updates.append(sequences) or {})

    def configure(c):
        c.num_iterations = 1
        c.designer.enabled = True
        c.designer.num_slots, c.designer.skills_per_regeneration = 2, 1
        c.designer.reward.scaling = "none"
        c.agent.replay_envs = 0
        c.agent.max_turns = 8
        c.agent.player = "scripted"
        c.agent.episodes_per_env = c.agent.hinted_episodes_per_env = 16
        c.hints.mode = "resample"
        c.checkpoint.every = 100

    run = random_selfplay(tmp_path, configure)
    try:
        (metrics,) = run.run()
    finally:
        run.close()
    (sequences,) = updates
    assert all(s.role == "designer" for s in sequences) and metrics["agent/episodes"] == 2 * 32
    near_adv, far_adv = sorted((int(s.tokens[-1]), s.advantage) for s in sequences)
    assert near_adv[1] > 0 > far_adv[1]
