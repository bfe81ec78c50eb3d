"""experiments/learning_study's report: its numbers from hand-written run metrics."""

import json
import types
from pathlib import Path

from experiments import learning_study as study


def _write_run(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_report_gives_means_spreads_token_totals_and_the_per_seed_bar(tmp_path):
    key = "eval/envs-2-programs/score"
    (tmp_path / "initial" / "evals" / "initial").mkdir(parents=True)
    (tmp_path / "initial" / "evals" / "initial" / "envs.json").write_text(json.dumps({"score": 0.25}))
    for seed, (admission, regret, end) in enumerate([((1.0, 0.5), (0.2, 0.4), 0.5), ((0.75, 0.25), (0.1, 0.1), 0.125)]):
        _write_run(tmp_path / "spade" / f"seed{seed}", [
            {"iteration": 0, "designer/admission_rate": admission[0], "env/regret_mean": regret[0],
             "agent/generated_tokens": 100, "agent/plain_win_rate": 0.25 * seed},
            {"iteration": 1, "designer/admission_rate": admission[1], "env/regret_mean": regret[1],
             "agent/generated_tokens": 50, key: end, "eval/envs-2-programs-sampled/score": end / 2},
        ])
        _write_run(tmp_path / "placebo" / f"seed{seed}", [{"iteration": 0, "env/regret_mean": 0.05 * (seed + 1)}])
    _write_run(tmp_path / "resample" / "seed0", [{"iteration": 0, "env/regret_mean": 0.02}])  # seed 1 not run
    args = types.SimpleNamespace(study_dir=tmp_path, preset="configs/tiny.py", iterations=2, seeds=[0, 1],
                                 arms=["spade", "placebo", "resample", "frozen"], report=tmp_path / "study.md",
                                 agent_token_budget=0, fixed_pool_envs=8, override=["--config.rl.lr=1e-3"])
    text = study.report(args)
    spade_row = next(line for line in text.splitlines() if line.startswith("| spade |"))
    # held-out at the end (0.5, 0.125); admission run means (0.75, 0.5); regret (0.3, 0.1); tokens 150 each
    # the sampled twin of the held-out score, (0.25, 0.0625), never taken for the greedy one
    assert spade_row.split(" | ")[1:5] == ["0.312 ± 0.188 (n=2)", "0.156 ± 0.094 (n=2)", "0.625 ± 0.125 (n=2)",
                                           "0.200 ± 0.100 (n=2)"]
    assert "150 ± 0 (n=2)" in spade_row
    assert spade_row.split(" | ")[8] == "0.125 ± 0.125 (n=2)"  # plain win rate, run means 0.0 and 0.25
    assert "| frozen | not run |" in text and "Held-out score of the initial policy: 0.25" in text
    assert (f"`python -m experiments.learning_study --study_dir {tmp_path} --arms spade,placebo,resample,frozen --seeds 0,1 "
            "--iterations 2 --override=--config.rl.lr=1e-3`") in text
    # per seed: lowest admission, regret, the placebo's and resample's regret on the same seed, held-out end,
    # initial (no resample run for seed 1)
    assert "| 0 | 0.500 | 0.300 | 0.050 | 0.020 | 0.500 | 0.250 |" in text
    assert "| 1 | 0.250 | 0.100 | 0.100 | - | 0.125 | 0.250 |" in text
    assert (tmp_path / "study" / "env_regret_mean.png").exists()


def test_no_report_runs_without_touching_the_report(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(study, "run_study", lambda args, preset: ran.append(args.arms))
    monkeypatch.setattr(study.presets, "load", lambda spec: None)
    report = tmp_path / "study.md"
    monkeypatch.setattr("sys.argv", ["learning_study.py", "--study_dir", str(tmp_path), "--arms", "spade",
                                     "--report", str(report), "--no_report"])
    study.main()
    assert ran == [["spade"]] and not report.exists()


def test_a_token_budget_reaches_every_run_and_a_run_that_spent_it_is_finished(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(study, "_run", lambda cmd, log: commands.append(cmd))
    spent = [{"iteration": 0, "agent/generated_tokens": 60}, {"iteration": 1, "agent/generated_tokens": 50}]
    _write_run(tmp_path / "spade" / "seed0", spent)  # 110 tokens in 2 of 10 iterations: finished at 100
    _write_run(tmp_path / "spade" / "seed1", spent[:1])  # 60 tokens: resumed
    args = types.SimpleNamespace(study_dir=tmp_path, preset="configs/tiny.py", iterations=10, seeds=[0, 1],
                                 arms=["spade"], agent_token_budget=100, override=[], fixed_pool_envs=8)
    study.run_study(args, types.SimpleNamespace(eval=types.SimpleNamespace(suites="")))
    (command,) = commands
    assert f"--workdir={tmp_path / 'spade' / 'seed1'}" in command
    assert "--config.agent_token_budget=100" in command and "--config.num_iterations=10" in command
