"""The learning ladder's statistics and play allocation (`experiments/ladder/sanity.py`) against hand-computed numbers."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rl_sanity():
    from experiments.ladder import sanity

    return sanity


def test_mcnemar_p_is_the_two_sided_binomial_tail_of_the_discordant_pairs(rl_sanity):
    # 6 pairs lost -> won, 1 won -> lost, 3 concordant: n = 7, tail P(X <= 1) = 8/128, p = 0.125.
    before = np.array([0, 0, 0, 0, 0, 0, 1, 1, 0, 1], bool)
    after = np.array([1, 1, 1, 1, 1, 1, 0, 1, 0, 1], bool)
    assert rl_sanity.mcnemar_p(before, after) == pytest.approx(0.125)
    assert rl_sanity.mcnemar_p(after, before) == pytest.approx(0.125)
    assert rl_sanity.mcnemar_p(before, before) == 1.0


def test_block_means_with_standard_errors(rl_sanity):
    blocks = rl_sanity.block_means([0.0, 1.0, 0.5, 0.5, 2.0], 2)
    assert blocks[0] == pytest.approx((0.5, 0.5))  # std (ddof 1) 0.7071 / sqrt 2
    assert blocks[1] == pytest.approx((0.5, 0.0))
    assert blocks[2] == (2.0, 0.0)


def test_allocate_plays_follows_the_posterior_variance(rl_sanity):
    # p = 1/18, 2/18, 17/18: weights 17, 32, 17 (/324); 36 plays beyond the minimum of 4 each
    # give shares 13.27, 21.45, 13.27; the one play left by flooring goes to the largest remainder.
    counts = rl_sanity.allocate_plays({"a": 0, "b": 1, "c": 16}, {"a": 16, "b": 16, "c": 16}, 48, 4)
    assert counts == {"a": 13, "b": 22, "c": 13}
    assert rl_sanity.allocate_plays({"a": 0, "b": 0}, {"a": 0, "b": 0}, 10, 2) == {"a": 5, "b": 5}
    with pytest.raises(ValueError, match="below 4 plays"):
        rl_sanity.allocate_plays({"a": 0, "b": 0}, {"a": 0, "b": 0}, 7, 4)


def test_allocate_plays_by_headroom_keeps_rare_wins_fed(rl_sanity):
    # p = 1/18, 2/18, 17/18: weights 1 - p = 17, 16, 1 (/18); 36 plays beyond the minimum give
    # shares 22, 20.94, 5.06; the play left by flooring goes to b. The solved program c drops to
    # near the minimum and the rarely won a gets the most, where variance gives a and c the same.
    counts = rl_sanity.allocate_plays({"a": 0, "b": 1, "c": 16}, {"a": 16, "b": 16, "c": 16}, 48, 4, "headroom")
    assert counts == {"a": 22, "b": 21, "c": 5}
    with pytest.raises(ValueError, match="unknown allocation rule"):
        rl_sanity.allocate_plays({"a": 0}, {"a": 0}, 4, 4, "greedy")


def _evaluation(programs, sampled):
    return {"programs": programs, "sampled": sampled, "greedy": sampled}


def test_family_rates_per_program_in_order_of_appearance(rl_sanity):
    rates = rl_sanity.family_rates(_evaluation(["b", "a", "b", "a", "b"], [True, False, True, True, False]))
    assert list(rates) == ["b", "a"] and rates == {"b": pytest.approx(2 / 3), "a": 0.5}


def test_rung1_report_from_a_stopped_runs_json(rl_sanity, tmp_path, monkeypatch):
    # One finished arm (seed 0) and one stopped before its final evaluation (seed 1, no "after"):
    # the report covers seed 0 alone. a: 0/2 -> 2/2, b: 1/2 -> 1/2; 2 discordant pairs, p = 0.5.
    programs = ["a", "a", "b", "b"]
    finished = {"seed": 0, "lr": 3e-4, "seconds": 10.0, "episodes": 8,
                "updates": [{"train_win_rate": 0.25}, {"train_win_rate": 0.5}],
                "before": _evaluation(programs, [False, False, True, False]),
                "after": _evaluation(programs, [True, True, True, False])}
    stopped = {"seed": 1, "lr": 3e-4, "updates": [], "before": _evaluation(programs, [False] * 4)}
    (tmp_path / "rung1.json").write_text(json.dumps([finished, stopped]))
    monkeypatch.setattr("sys.argv", ["rl_sanity.py", "--rung", "1", "--out", str(tmp_path), "--report_only"])
    rl_sanity.main()
    report = (tmp_path / "rung1.md").read_text()
    assert "| 0 | 0.0003 | 0.250 → 0.750 | 0.5 |" in report
    assert "| seed | lr | a | b |" in report and "| 0 | 0.0003 | 0.00 → 1.00 | 0.50 → 0.50 |" in report
    assert "| 1 |" not in report and "**Bar not met.**" in report  # p >= 0.05
    assert (tmp_path / "rung1.png").exists()


def test_report_only_refuses_a_missing_or_unfinished_json(rl_sanity, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["rl_sanity.py", "--rung", "1", "--out", str(tmp_path), "--report_only"])
    with pytest.raises(SystemExit, match="does not exist"):
        rl_sanity.main()
    (tmp_path / "rung1.json").write_text('[{"seed": 0, "lr": 0.1, "updates": []}]')
    with pytest.raises(SystemExit, match="no finished arm"):
        rl_sanity.main()
