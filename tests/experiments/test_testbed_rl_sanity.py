"""Rung 1 on the testbed (`python -m experiments.ladder.sanity --preset testbed`): knob sampling of the training plays,
the evaluation's knob values, the per-knob report, the bar, and resuming a stopped run."""

import argparse
import collections
import json

import numpy as np
import pytest

from spade_jax.envs.library import testbed


@pytest.fixture(scope="module")
def rl_sanity():
    from experiments.ladder import sanity

    return sanity


def _setup(rl_sanity, families=("code_lock", "bisect")):
    return rl_sanity.Setup(config=None, families=list(families), pool=None, load="", testbed=True)


def test_training_plays_come_in_groups_at_one_trained_knob_value(rl_sanity):
    setup = _setup(rl_sanity)
    items = rl_sanity.training_items(setup, {"code_lock": 10, "bisect": 8}, lambda n, j: j, "uniform", 4,
                                     np.random.default_rng(0))
    assert [i.family for i in items] == ["code_lock"] * 10 + ["bisect"] * 8 and [i.seed for i in items[:10]] == list(range(10))
    for family, n in (("code_lock", 10), ("bisect", 8)):
        knobs = [i.knob for i in items if i.family == family]
        groups = [knobs[g:g + 4] for g in range(0, n, 4)]  # 4, 4, 2 and 4, 4
        assert all(len(set(g)) == 1 and g[0] in testbed.get(family).trained for g in groups)
    many = rl_sanity.training_items(setup, {"code_lock": 4000}, lambda n, j: j, "uniform", 1, np.random.default_rng(1))
    counts = collections.Counter(i.knob for i in many)
    assert set(counts) == set(testbed.get("code_lock").trained) and min(counts.values()) > 4000 / 7 * 0.8


def test_level_sampling_plays_the_programs_levels(rl_sanity):
    setup = _setup(rl_sanity, ("carry_add",))
    items = rl_sanity.training_items(setup, {"carry_add": 300}, lambda n, j: j, "levels", 1, np.random.default_rng(0))
    assert set(i.knob for i in items) == set(testbed.level_values("carry_add").values())
    with pytest.raises(ValueError, match="unknown knob sampling"):
        rl_sanity.draw_knob("carry_add", "nope", np.random.default_rng(0))


def test_evaluation_cycles_the_trained_values_or_all_of_them(rl_sanity):
    setup = _setup(rl_sanity)
    trained = rl_sanity.evaluation_items(setup, 0, 20, "trained")
    everything = rl_sanity.evaluation_items(setup, 0, 20, "all")
    code_lock = testbed.get("code_lock")
    assert [i.knob for i in trained[:20]] == [code_lock.trained[j % len(code_lock.trained)] for j in range(20)]
    assert [i.knob for i in everything[:20]] == [code_lock.allowed[j % len(code_lock.allowed)] for j in range(20)]
    assert [i.seed for i in trained] == [i.seed for i in everything]  # the same fresh seeds
    assert len({i.seed for i in trained}) == 40 and rl_sanity.evaluation_items(setup, 1, 20, "all")[0].seed != trained[0].seed
    seed_library = rl_sanity.Setup(config=None, families=["knapsack"], pool=None, load="")
    assert {i.knob for i in rl_sanity.evaluation_items(seed_library, 0, 5, "trained")} == {None}


def _record(seed, lr, before, after, knobs, programs):
    evaluation = lambda won: {"sampled": won, "programs": programs, "knobs": knobs}  # noqa: E731
    return {"seed": seed, "lr": lr, "seconds": 1.0, "episodes": 4, "updates": [{"train_win_rate": 0.5}],
            "before": evaluation(before), "after": evaluation(after)}


def test_the_report_has_a_win_rate_per_knob_value_and_the_bar_is_per_seed(rl_sanity):
    programs, knobs = ["code_lock"] * 40, [2, 3] * 20
    up = _record(0, 1e-3, [False] * 40, [True] * 6 + [False] * 34, knobs, programs)  # +0.15, 6 discordant: p 0.031
    flat = _record(0, 0.0, [False] * 40, [False] * 40, knobs, programs)
    args = argparse.Namespace(rung=1, block=10)
    lines, met = rl_sanity._verdict([up, flat], args)
    text = "\n".join(lines)
    assert met and "code_lock (LENGTH):" in text and "| seed | lr | 2 | 3 |" in text
    assert "| 0 | 0.001 | 0.00 → 0.15 | 0.00 → 0.15 |" in text
    small = _record(1, 1e-3, [False] * 40, [True] * 3 + [False] * 37, knobs, programs)  # +0.075, p 0.25
    assert not rl_sanity._verdict([up, flat, small], args)[1]
    drift = _record(0, 0.0, [False] * 40, [True] * 6 + [False] * 34, knobs, programs)  # a control that moved
    assert not rl_sanity._verdict([up, drift], args)[1]
    initial = "\n".join(rl_sanity.knob_table([flat], ["code_lock"], initial_only=True))
    assert "| 0 | 0 | 0.00 (20) | 0.00 (20) |" in initial


def test_a_stopped_run_resumes_with_its_finished_arms_and_refuses_other_options(rl_sanity, tmp_path):
    args = argparse.Namespace(rung=1, preset="testbed", updates=20, plays=16, allocate="uniform", min_plays=4,
                              window=0, eval_plays=32, knobs="uniform", group=4, eval_knobs="trained", greedy=False,
                              partial_credit=False)
    options = rl_sanity.run_options(args, 3e-4, "/boot")
    saved = tmp_path / "rung1.json"
    assert rl_sanity.resumed(saved, options) == []
    finished = {"seed": 0, "lr": 3e-4, "after": {}, "options": options}
    saved.write_text(json.dumps([finished, {"seed": 0, "lr": 0.0, "options": options}]))  # the control unfinished
    assert rl_sanity.resumed(saved, options) == [finished]
    for changed in ({"knobs": "levels"}, {"lr": 1e-3}, {"load": "/other"}):
        with pytest.raises(SystemExit, match=f"other options.*{next(iter(changed))}"):
            rl_sanity.resumed(saved, {**options, **changed})
