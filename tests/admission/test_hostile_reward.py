"""Reward hacking through admission: programs that would earn the designer's reward for noise,
an oracle solution or a level trick are rejected where they show, and the rule that rejects
them admits every seed program at every level.

The designer is rewarded by regret and the blend's plateau: a program whose outcome a coin
decides (a no-skill agent wins about half, the solution-hinted plays all) earns the blend's
maximum, and one whose solution() reads a secret earns full regret. tests/hostile_admission
holds one program per class; each was admitted before the blind stage and the solution-is-a-play
check existed (and before every level was judged like the default).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from spade_jax.admission import STAGES, AdmissionConfig, admit, admit_batch, blind_verdict
from spade_jax.envs import library
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.selfplay import config as config_lib

# Wall-clock and process-count bounds: run alone, not beside other tests (tests/run.sh).
pytestmark = pytest.mark.serial

HOSTILE = Path(__file__).parents[1] / "hostile_admission"
EXAMPLES = Path(__file__).parents[1] / "sandbox_examples"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2, load_timeout_s=10.0, call_timeout_s=5.0)) as p:
        yield p


# --- the rule, on hand-computed numbers ------------------------------------------------------

def test_blind_verdict_counts_seeds_that_different_answers_win_alike():
    # 3 fixed answers x 10 seeds, each entry the move that won (0: lost)
    steps = np.zeros((3, 10), int)
    steps[0, [0, 1, 2, 5]] = 1
    steps[1, [0, 1, 2]] = 1
    steps[2, 2] = 1
    steps[0, 3], steps[1, 3] = 2, 4  # seed 3: two answers win by different routes (moves 2 and 4): a game
    extras = [[1, 1], [1, 0], [], [], *([[]] * 6)]  # seed 1: a further answer lost there
    seeds = [100 + i for i in range(10)]
    kwargs = dict(seeds=seeds, max_fixed_answer_win_rate=0.9)
    reason, stats = blind_verdict(steps, extras, max_blind_win_rate=0.1, **kwargs)
    assert stats == {"wins": [5, 4, 1], "seeds": 10, "won_whatever_the_answer": [100, 102]}
    assert reason == ("on 2 of 10 seeds different answers all win (seeds 100, 102): the seed decides the outcome, "
                      "not the play (limit 0.1)")
    assert blind_verdict(steps, extras, max_blind_win_rate=0.2, **kwargs)[0] is None  # 2/10 is not above 0.2
    extras[0] = [1, 3]  # a further answer that needs three moves: seed 0 is not won alike any more
    assert blind_verdict(steps, extras, max_blind_win_rate=0.1, **kwargs)[1]["won_whatever_the_answer"] == [102]


def test_blind_verdict_rejects_one_fixed_answer_that_wins_nearly_every_seed():
    steps = np.zeros((2, 16), int)
    steps[1, :15] = 3  # 15 of 16 > 0.9
    kwargs = dict(seeds=list(range(16)), max_fixed_answer_win_rate=0.9, max_blind_win_rate=0.1)
    reason, stats = blind_verdict(steps, [[]] * 16, **kwargs)
    assert reason == "fixed answer #1 wins 15 of 16 seeds (limit 0.9)" and stats["won_whatever_the_answer"] == []
    steps[1, 14] = 0  # 14 of 16 = 0.875
    assert blind_verdict(steps, [[]] * 16, **kwargs)[0] is None


def test_admission_config_checks_the_blind_fields():
    defaults = AdmissionConfig()
    assert (defaults.blind_seeds, defaults.max_blind_win_rate, defaults.max_fixed_answer_win_rate) == (16, 0.1, 0.9)
    for bad in (dict(blind_seeds=-1), dict(max_blind_win_rate=1.5), dict(max_fixed_answer_win_rate=-0.1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AdmissionConfig(**bad)
    assert "blind" in STAGES and STAGES.index("blind") == STAGES.index("feasibility") + 1


# --- the hostile programs ---------------------------------------------------------------------

EXPECT = {
    "coin_flip.py": ("blind", "different answers all win"),
    "one_shot_coin.py": ("blind", "different answers all win"),
    "fixed_answer.py": ("blind", "fixed answer #0 wins 16 of 16 seeds"),
    "backdoor_solution.py": ("feasibility", "solution() is not a play"),
    "level_coin.py": ("blind", "at difficulty 'hard': on "),
    "level_infeasible.py": ("feasibility", "difficulty='hard'"),
    "level_free_win.py": ("not_trivial", "at difficulty 'hard': random play wins"),
}


def _tiny_admission() -> AdmissionConfig:
    from configs import tiny

    return config_lib.admission_config(tiny.get_config())


@pytest.mark.parametrize("preset", ["default", "tiny"])
def test_reward_hacking_programs_are_rejected_where_they_show(pool, preset):
    config = AdmissionConfig() if preset == "default" else _tiny_admission()
    reports = admit_batch([(HOSTILE / n).read_text() for n in EXPECT], config, pool=pool, seed=0)
    for (name, (stage, reason)), report in zip(EXPECT.items(), reports):
        assert (report.admitted, report.stage) == (False, stage), (name, report.stage, report.reason)
        assert reason in report.reason, (name, report.reason)
    # level_coin is fair at its default and "easy" levels: only "hard" is judged a coin flip
    level_coin = reports[list(EXPECT).index("level_coin.py")]
    blind = level_coin.details["blind"]
    assert blind["default"]["won_whatever_the_answer"] == [] and blind["easy"]["won_whatever_the_answer"] == []


def test_the_coin_flip_passes_without_the_blind_stage_and_is_caught_by_it_alone(pool):
    """With the blind thresholds at 1 the stage never rejects: the coin flip then passes every
    other stage, so the blind stage is the layer that defends against it."""
    code = (HOSTILE / "coin_flip.py").read_text()
    off = AdmissionConfig(max_blind_win_rate=1.0, max_fixed_answer_win_rate=1.0)
    report = admit(code, off, pool=pool)
    assert report.admitted, report.reason
    assert len(report.details["blind"]["default"]["won_whatever_the_answer"]) >= 2


def test_an_oracle_solution_is_not_seen_by_blind_play(pool):
    """backdoor_solution's fixed answers win about 1 in 1000 seeds: the blind stage alone would
    admit it, so the check that rejects it is feasibility's solution-is-a-play rule."""
    report = admit((HOSTILE / "backdoor_solution.py").read_text(), AdmissionConfig(), pool=pool)
    assert (report.admitted, report.stage) == (False, "feasibility")
    assert "the observations so far are the same" in report.reason


# --- false rejects ----------------------------------------------------------------------------

def test_every_level_of_every_seed_program_passes_the_blind_stage(pool):
    """The false-reject count of the new rules on the seed library (every program, every
    declared level) and the sandbox examples: zero."""
    names = [env.name for env in library.SEED_ENVS]
    texts = [library.load_source(n) for n in names] + [(EXAMPLES / "boxed_game.py").read_text(),
                                                        (EXAMPLES / "tool_env.py").read_text()]
    reports = admit_batch(texts, AdmissionConfig(batch_novelty=False), pool=pool)
    failures = [(name, r.stage, r.reason) for name, r in zip(names + ["boxed_game", "tool_env"], reports)
                if not r.admitted]
    assert not failures, f"admission seed {reports[0].details['admission_seed']}: {failures}"
    for name, report in zip(names, reports):
        assert set(report.details["blind"]) == {"default", "easy", "medium", "hard"}, name
        assert all(len(s["wins"]) >= 2 for s in report.details["blind"].values()), name
