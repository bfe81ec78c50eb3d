"""The loop's schedule of designer rewards against the reference's (spade-rl/spade,
`spade/slime/spade_rollout.py` and `spade/core/orchestrator.py`): designs made at iteration d
are trained at d + delay on the plays of the iterations between, the last pool is trained at
the run's last iteration, and hinted plays run only where a pool regenerates."""

import numpy as np
import pytest

from spade_jax.admission import AdmissionReport
from spade_jax.agent import play_episodes
from spade_jax.designer.rollout import DesignSample
from spade_jax.envs import library
from spade_jax.selfplay import loop


def _canned_designs(program):
    def propose(policy, memory, corpus, cfg, *, seed, slots, attempt=0):
        return [DesignSample(slot=i, skill=("logical deduction", "arithmetic")[i], difficulty="medium", doc_id=None,
                             doc_excerpt="", prompt_tokens=np.array([1, 2], np.int32),
                             tokens=np.array([3, 4 + seed % 5], np.int32), logprobs=np.zeros(2, np.float32),
                             text=program)
                for i in slots]

    def admit(samples, pool, memory, admission, seed=None, earlier=()):
        import dataclasses
        return [dataclasses.replace(s, report=AdmissionReport(True, "novelty", "", code=program)) for s in samples]

    return propose, admit


@pytest.fixture
def schedule_run(tmp_path, small_tokenizer, canned_sampler, random_selfplay, monkeypatch):
    """A run of 6 iterations, regenerating every 4 with the reward delayed 4 (the reference's
    recipe), its updates recorded instead of applied: {iteration: [designer sequences]}, and the
    iterations in which each hinted play ran."""
    program = library.load_source("arithmetic")
    propose, admit = _canned_designs(program)
    monkeypatch.setattr(loop, "propose", propose)
    monkeypatch.setattr(loop, "admit_samples", admit)
    sample = canned_sampler(small_tokenizer.encode("<answer>1</answer>"))
    hinted_at = []
    current = {}

    def play(policy, pool, requests, cfg, **kwargs):
        hinted_at.extend(current["it"] for r in requests if r.hinted)
        plain_seeds = {(r.env_key, r.seed) for r in requests if not r.hinted}
        assert not any((r.env_key, r.seed) in plain_seeds for r in requests if r.hinted)  # seeds of their own
        return play_episodes(policy, pool, requests, cfg, sample=sample, **kwargs)

    monkeypatch.setattr(loop, "play_episodes", play)
    trained = {}
    original_iteration = loop.SelfPlay.iteration

    def iteration(self, it):
        current["it"] = it
        return original_iteration(self, it)

    def update(self, sequences):
        trained[current["it"]] = [s for s in sequences if s.role == "designer"]
        return {}

    monkeypatch.setattr(loop.SelfPlay, "iteration", iteration)
    monkeypatch.setattr(loop.SelfPlay, "_update", update)

    def configure(c):
        c.num_iterations = 6
        c.designer.enabled = True
        c.designer.num_slots = 2
        c.agent.hinted_episodes_per_env = 2
        c.designer.regeneration_period, c.designer.reward_delay = 4, 4
        c.agent.replay_envs = 1
        c.hints.mode = "solution"
        c.checkpoint.every = 100

    run = random_selfplay(tmp_path, configure)
    try:
        run.run()
    finally:
        run.close()
    return trained, hinted_at


def test_designs_train_delay_iterations_later_the_last_pool_at_the_end_and_only_regeneration_steps_are_hinted(
        schedule_run):
    trained, hinted_at = schedule_run
    # designs of iteration 0 wait four iterations (spade_rollout.py: buffered at d, trained at d + 4) ...
    assert [len(trained[i]) for i in range(4)] == [0, 0, 0, 0] and len(trained[4]) == 2
    # ... and the pool designed at 4 is flushed at the run's last iteration (num_rollout - 1)
    assert len(trained[5]) == 2
    # hints are played for the two new designs x two seeds at the regeneration steps 0 and 4
    # only (orchestrator.py computes hints when it regenerates); replays are never hinted
    assert sorted(set(hinted_at)) == [0, 4] and len(hinted_at) == 2 * 2 * 2
