"""experiments/ladder/loop.py: pairing, the reports' verdicts on hand-made records, and both rungs end
to end on the runlocal preset (one seed, one iteration). The paired tests:
tests/experiments/test_experiments_stats.py."""

import json

import pytest

from experiments.ladder import loop as ladder
from spade_jax.bootstrap import BootstrapConfig


def test_pairing_refuses_sets_scored_on_other_items():
    with pytest.raises(ValueError, match="same items"):
        ladder.paired({"items": [0, 1], "reward": [0, 1]}, {"items": [1, 0], "reward": [1, 0]}, "reward")


def test_run_config_gives_the_rungs_overrides_and_refuses_a_run_saved_with_another(tmp_path):
    args = ladder.parse_args(["--rung", "2", "--study_dir", str(tmp_path), "--seeds", "0", "--preset",
                              "configs/tiny.py:runlocal", "--slots", "4"])
    sargs = ladder.study_args(args, ladder.RUNG2_ARMS)
    config = ladder.run_config(sargs, "spade", 0)
    assert (config.rl.agent_weight, config.designer.num_slots, config.designer.skills_per_regeneration) == (0, 4, 2)
    assert config.designer.train and not ladder.run_config(sargs, "frozen", 0).designer.train
    saved = json.loads(config.to_json())
    saved["designer"]["temperature"] += 0.1
    (tmp_path / "spade" / "seed0").mkdir(parents=True)
    (tmp_path / "spade" / "seed0" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(SystemExit, match="designer"):
        ladder.run_config(sargs, "spade", 0)


def _designs(rewards, admitted=None, items=None):
    admitted = [True] * len(rewards) if admitted is None else admitted
    return {"items": list(range(len(rewards))) if items is None else items, "reward": rewards,
            "admitted": admitted, "skill": ["logic"] * len(rewards), "stage": ["ok"] * len(rewards),
            "win_rate": [0.5 if a else None for a in admitted],
            "code": ["def solve():\n    return 1" if a else None for a in admitted], "run_admission": 0.75}


def test_rung2_bar_needs_the_trained_designer_above_the_control_and_half_admitted():
    initial = [-1.0, -1.0, 0.0, 0.2, 0.5, -1.0]
    trained = [0.6, 0.6, 0.6, 0.6, 0.9, 0.6]  # above the control on all 6 prompts: p = 2 / 2**6
    records = {0: {"initial": _designs(initial), "frozen": _designs(initial), "spade": _designs(trained)}}
    lines, met = ladder.rung2_report(records)
    spade_row = next(line for line in lines if line.startswith("| 0 | spade |"))
    assert "-0.383 → 0.650 | 0.0312 | 0.0312 (-0.383 → 0.650)" in spade_row
    assert next(line for line in lines if line.startswith("| 0 | frozen |")).split(" | ")[3] == "1"
    assert met and "def solve():" in "\n".join(lines)
    assert any(line.startswith("The control trains nothing: on seed(s) 0 ") for line in lines)
    records[0]["frozen"] = _designs([-1.0] * 6)
    assert not any(line.startswith("The control trains nothing") for line in ladder.rung2_report(records)[0])
    records[0]["frozen"] = _designs(initial)

    records[0]["spade"] = _designs(trained, admitted=[True, True, False, False, False, False])
    assert not ladder.rung2_report(records)[1]  # a third admitted
    records[0]["spade"] = _designs(trained, items=[5, 4, 3, 2, 1, 0])
    with pytest.raises(ValueError):
        ladder.rung2_report(records)
    assert not ladder.rung2_report({0: {k: _designs(initial) for k in ("initial", "frozen", "spade")}})[1]


def test_the_scripted_players_frontier_is_where_the_blend_pays_most():
    """Budgets 2.5 / 4.5, width 0.5 (the defaults): finish probabilities 0.73 / 0.99 at length 2
    and 0.27 / 0.95 at 3 give regret above the 0.15 scale (0.4) and a plateau of 1 - 0.13 / 0.25
    (0.288): 0.688 at both; length 4 has regret but no plateau (0.4)."""
    from spade_jax.selfplay.config import base_config

    config = base_config()
    assert ladder.frontier(config) == [2, 3]
    assert ladder.expected_reward(2, config) == pytest.approx(0.4 + 0.6 * (1 - (1 / (1 + 2.718281828 ** -1) - 0.6)
                                                                           / 0.25), abs=1e-6)
    assert ladder.expected_reward(4, config) == pytest.approx(0.4, abs=1e-3)
    assert ladder.expected_reward(8, config) < 0.01


def _scripted_designs(rewards, lengths, items=None):
    designs = _designs(rewards, items=items)
    return {**designs, "length": lengths, "attempts": [1] * len(rewards),
            "run": {"iteration": [0, 1], "length": [5, 3]}}


def test_rung2b_bar_needs_the_trained_designer_above_the_frozen_one_and_nearer_the_frontier():
    initial, trained = [0.4, 0.1, 0.4, 0.0, 0.1, 0.4], [0.69, 0.4, 0.69, 0.69, 0.69, 0.69]
    records = {0: {"initial": _scripted_designs(initial, [5, 6, 4, 7, 6, 5]), "frontier": [2, 3],
                   "frozen": _scripted_designs(initial, [5, 6, 4, 7, 6, 5]),
                   "spade": _scripted_designs(trained, [3, 4, 2, 3, 3, 2])}}
    lines, met = ladder.rung2b_report(records)
    spade_row = next(line for line in lines if line.startswith("| 0 | spade |"))
    assert "0.233 → 0.642 | 0.0312 | 0.0312 (0.233 → 0.642)" in spade_row
    assert "5.500 → 3.000 | 2.50 → 0.17 |" in spade_row  # median length; mean distance to {2, 3}
    assert met and "solution length 3" in "\n".join(lines)
    records[0]["spade"] = _scripted_designs(trained, [7, 7, 7, 7, 7, 7])  # higher reward, farther away
    assert not ladder.rung2b_report(records)[1]


def _plays(won, **extra):
    items = [f"f/{('easy', 'hard')[i % 2]}/{i}" for i in range(len(won))]  # family/level/seed
    return {"items": items, "won": won, "heldout": 0.25, "agent_tokens": 100, "iterations": 2, **extra}


def test_rung3_bar_needs_spade_above_the_initial_policy_and_every_control():
    initial = [False] * 8
    spade = [True] * 7 + [False]  # 7 discordant, all won after: p = 2 / 2**7
    records = {0: {"initial": _plays(initial), "spade": _plays(spade), "frozen": _plays(initial)}}
    records[0]["frozen"]["agent_tokens"] = 60
    result = {"records": records, "initial_heldout": 0.1, "agent_token_budget": 100}
    lines, met = ladder.rung3_report(result, ["spade", "frozen"])
    rows = [line for line in lines if line.startswith("| 0 |")]
    assert rows[0] == "| 0 | 0.000 → 0.875 | 0.0156 | 0.00 / 0.00 → 1.00 / 0.75 | – | 0.100 → 0.250 | 100 | 2 |"
    assert rows[1].startswith("| 0 | 0.000 → 0.000 | 1 | 0.00 / 0.00 → 0.00 / 0.00 | 0.0156 (0.000 vs 0.875) | "
                              "0.100 → 0.250 | 60 (budget")
    assert met
    records[0]["frozen"] = _plays(spade)
    assert not ladder.rung3_report(result, ["spade", "frozen"])[1]
    assert not ladder.rung3_report(result, ["frozen"])[1]  # controls alone


def test_both_rungs_run_end_to_end_and_resume(tmp_path, tiny_bootstrap_cache, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")  # the runs: one device, fast compiles
    shared = [f"--override=--config.bootstrap.cache_dir={tiny_bootstrap_cache}",
              f"--override=--config.compile_cache_dir={tmp_path / 'xla'}"]
    common = ["--preset", "configs/tiny.py:runlocal", "--seeds", "0", "--iterations", "1", *shared]
    rung2 = ["--rung", "2", "--study_dir", str(tmp_path / "r2"), "--prompts", "3", "--slots", "2", *common]
    ladder.main(rung2)
    result = json.loads((tmp_path / "r2" / "rung2.json").read_text())
    record = result["result"]["0"]
    assert sorted(record) == ["frozen", "initial", "spade"]
    assert record["initial"]["items"] == record["spade"]["items"] == record["frozen"]["items"]  # the same prompts
    assert [item.split(":")[0] for item in record["initial"]["items"]] == ["0", "1", "2"]
    assert all(len(record[k]["reward"]) == 3 for k in record)
    text = (tmp_path / "r2" / "rung2.md").read_text()
    assert "| 0 | spade |" in text and "| 0 | frozen |" in text
    assert text.rstrip().endswith(f"**Bar {'met' if result['bar_met'] else 'not met'}.**")
    assert (tmp_path / "r2" / "rung2.png").stat().st_size and (tmp_path / "r2" / "rung2_study.md").exists()

    capsys.readouterr()
    ladder.main(rung2)  # resumed: runs and scores are read, not redone
    out = capsys.readouterr().out
    assert "spade seed 0: finished" in out and "frozen seed 0: finished" in out and "$ " not in out

    ladder.main(["--rung", "2b", "--study_dir", str(tmp_path / "r2b"), "--prompts", "2", *common])
    result = json.loads((tmp_path / "r2b" / "rung2b.json").read_text())
    record = result["result"]["0"]
    assert record["initial"]["items"] == record["spade"]["items"] == record["frozen"]["items"]
    assert record["frontier"] == [2, 3] and len(record["spade"]["length"]) == 2
    assert sorted(record["spade"]["run"]) == ["iteration", "length"]
    config = ladder.run_config(ladder.study_args(ladder.parse_args(
        ["--rung", "2b", "--study_dir", str(tmp_path / "r2b"), "--prompts", "2", *common]), ladder.RUNG2_ARMS),
        "spade", 0)
    assert (config.agent.player, config.hints.mode, config.designer.reward_delay) == ("scripted", "resample", 1)
    assert (tmp_path / "r2b" / "rung2b.png").stat().st_size

    ladder.main(["--rung", "3", "--study_dir", str(tmp_path / "r3"), "--arms", "spade,frozen", "--eval_plays", "1",
                 "--agent_token_budget", "1000000", *common])
    result = json.loads((tmp_path / "r3" / "rung3.json").read_text())
    record = result["result"]["records"]["0"]
    assert record["initial"]["items"] == record["spade"]["items"] == record["frozen"]["items"]
    # one fresh seed of each trained family at each of its levels
    assert len(record["spade"]["won"]) == sum(len(ladder.family_levels(n)) for n in BootstrapConfig().envs) > 6
    assert {item.split("/")[1] for item in record["spade"]["items"]} == {"easy", "medium", "hard"}
    text = (tmp_path / "r3" / "rung3.md").read_text()
    assert "**spade**" in text and "**frozen**" in text and "p (McNemar, vs spade final)" in text
    assert (tmp_path / "r3" / "rung3.png").stat().st_size
