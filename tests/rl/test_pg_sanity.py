"""Policy-gradient sanity: rewarding one answer token makes the policy say it more."""

import jax
import numpy as np

from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.rl.advantages import agent_advantages
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sampling import generate_on_rows

PROMPT = [1, 2, 3]
TARGET = 5


def test_updates_raise_probability_and_reward_of_the_preferred_answer():
    config = ModelConfig(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16
    )
    policy = random_policy(config, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    trainer = Trainer(policy, OptimConfig(lr=3e-2, weight_decay=0.0), LossConfig())

    def p_target():
        return float(jax.nn.softmax(policy.logits(np.asarray([PROMPT]))[0, -1])[TARGET])

    start_p, rewards = p_target(), []
    for step in range(8):
        gen = generate_on_rows(policy, [PROMPT] * 32, max_new_tokens=1, temperature=1.0, seed=step, stop_token_ids=())
        answers = gen.tokens[:, 0]
        reward = (answers == TARGET).astype(float)
        rewards.append(reward.mean())
        adv = agent_advantages(reward, [0] * len(reward), [False] * len(reward)).advantages
        seqs = [
            TrainSequence(PROMPT + [int(a)], [False] * 3 + [True], [0.0] * 3 + [float(gen.logprobs[i, 0])], advantage=float(adv[i]))
            for i, a in enumerate(answers)
        ]
        trainer.update(pack(seqs, row_length=32))
    assert p_target() > 2 * start_p
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3])
