"""Rung 0 of the learning ladder, fast: the agent's RL path learns a one-instance bandit.

Plays on the rollout engine, group-centred advantages (`scoring.agent_sequences`), packing
and the policy-gradient update, on a one-layer random model: a program whose only instance
pays any reply that holds a target letter is learned within a few updates; the same updates
at learning rate 0 leave the win rate where it was (the same seeds replay the same tokens).
`experiments/ladder/sanity.py` is the full rung on the trained `tiny` policy.
"""

from collections import Counter

import jax
import numpy as np
import pytest

from spade_jax.agent.rollout import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.rl.batch import pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.selfplay.scoring import agent_sequences

BANDIT = '''
class BanditEnv:
    """One instance whatever the seed: a reply that holds TARGET wins."""

    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = 1

    def reset(self, seed=None):
        return "Write a few characters.", {}

    def step(self, action):
        return "Done.", (1.0 if TARGET in action else 0.0), True, False, {}
'''
PLAYS = 32
EVAL_SEEDS = range(1000, 1064)
# A random model never stops by itself: its cut replies are stepped (`every_play_counts`).
CFG = AgentConfig(max_turns=1, max_new_tokens=3, temperature=1.0, context_budget=256, user_template="{observation}",
                  every_play_counts=True)


def _policy(tokenizer):
    arch = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16)
    return random_policy(arch, tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))


def _play(policy, pool, program, seeds, stream):
    requests = [EpisodeRequest(0, program, s) for s in seeds]
    return play_episodes(policy, pool, requests, CFG, seed=stream, read_action=lambda reply: reply)


def _win_rate(policy, pool, program) -> float:
    return float(np.mean([t.reward for t in _play(policy, pool, program, EVAL_SEEDS, stream=7)]))


def _learn(policy, pool, program, lr: float, updates: int) -> list[float]:
    trainer = Trainer(policy, OptimConfig(lr=lr, weight_decay=0.0), LossConfig())
    curve = [_win_rate(policy, pool, program)]
    for u in range(updates):
        plays = _play(policy, pool, program, range(u * PLAYS, (u + 1) * PLAYS), stream=100 + u)
        sequences = agent_sequences(plays, [None], train_hinted=False, regret_weighting=False,
                                    regret_temperature=1.0, weight=1.0)
        if sequences:
            trainer.update(pack(sequences, 64))
        curve.append(_win_rate(policy, pool, program))
    return curve


@pytest.fixture(scope="module")
def bandit(small_tokenizer):
    """The pool, and the program with a target letter the random model's replies hold a
    quarter to a half of the time (chosen from its first plays, so the start is not at 0 or 1)."""
    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        replies = [m["content"] for t in _play(_policy(small_tokenizer), pool, BANDIT.replace(
            "TARGET in action", "False"), EVAL_SEEDS, stream=7) for m in t.messages if m["role"] == "assistant"]
        counts = Counter(c for reply in replies for c in set(reply) if c.isalpha())
        share = {c: n / len(replies) for c, n in counts.items()}
        target = min((c for c in share if 0.15 <= share[c] <= 0.5), key=lambda c: abs(share[c] - 0.3))
        yield pool, f"TARGET = {target!r}\n" + BANDIT


def test_a_one_instance_bandit_is_learned_in_a_few_updates(small_tokenizer, bandit):
    pool, program = bandit
    curve = _learn(_policy(small_tokenizer), pool, program, lr=3e-2, updates=8)
    assert curve[0] <= 0.6
    assert max(curve) >= 0.8 and curve[-1] >= curve[0] + 0.3, curve


def test_the_same_updates_at_learning_rate_zero_do_not_move_it(small_tokenizer, bandit):
    pool, program = bandit
    curve = _learn(_policy(small_tokenizer), pool, program, lr=0.0, updates=3)
    assert curve == [curve[0]] * len(curve)
