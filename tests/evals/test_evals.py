"""Held-out evaluation: the runner, the environment-directory suite, the CLI, the main job's
periodic evaluation and its resume."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from spade_jax.admission import AdmissionConfig
from spade_jax.agent import AgentConfig, EpisodeRequest, Trajectory, play_episodes
from spade_jax.envs import library
from spade_jax.evals import runner
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread, stable_seed
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.evals.suites.envs import EnvironmentSuite
from spade_jax.selfplay import config as config_lib
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.sandbox.records import StepResult

REPO = Path(__file__).resolve().parents[2]
BROKEN = "class BrokenEnv:\n    def reset(self, seed=None):\n        return 'x'\n"


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    directory = tmp_path_factory.mktemp("heldout")
    (directory / "arithmetic.py").write_text(library.load_source("arithmetic"))
    (directory / "tallest.py").write_text(library.load_source("tallest"))
    (directory / "broken.py").write_text(BROKEN)
    return directory


@pytest.fixture(scope="module")
def policy(small_tokenizer):
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    return random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))


def test_pass_at_k_and_summary_by_hand():
    assert runner.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert runner.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert runner.pass_at_k(3, 3, 2) == 1.0 and runner.pass_at_k(3, 0, 3) == 0.0
    items = [Item("a", "g1", messages=({"role": "user", "content": "?"},)),
             Item("b", "g2", messages=({"role": "user", "content": "?"},))]
    scores = [[Score(1.0, True), Score(0.0, False)], [Score(0.5, False), Score(0.5, False)]]
    summary = runner.summarize(items, scores, GenerationSettings(samples=2))
    assert summary["score"] == 0.5 and summary["solved"] == 0.25
    assert summary["pass@1"] == pytest.approx(0.25) and summary["pass@2"] == pytest.approx(0.5)
    assert summary["groups"]["g1"]["pass@2"] == 1.0 and summary["groups"]["g2"]["score"] == 0.5


def test_spread_covers_every_group_keeps_item_order_and_depends_only_on_the_seed():
    groups = ["a"] * 6 + ["b"] * 2 + ["c"] * 3
    assert spread(groups, None, 0, "x") == spread(groups, 11, 0, "x") == list(range(11))
    kept = spread(groups, 5, 0, "x")
    assert kept == sorted(kept) and len(kept) == 5
    assert sorted(groups[i] for i in kept) == ["a", "a", "b", "b", "c"]  # round-robin a, b, c, a, b
    assert spread(groups, 5, 0, "x") == kept
    assert sorted(groups[i] for i in spread(groups, 3, 7, "x")) == ["a", "b", "c"]
    assert len({tuple(spread(groups, 4, seed, "x")) for seed in range(10)}) > 1
    assert stable_seed("x", 1, "a") == stable_seed("x", 1, "a") != stable_seed("x", 2, "a")


def test_suite_lists_may_hold_commas_inside_an_argument():
    cfg = runner.EvalConfig(suites="gymnax:Catch-bsuite,DeepSea-bsuite, rg-hard,bfcl:base,miss_func,envs:dir")
    assert cfg.specs == ("gymnax:Catch-bsuite,DeepSea-bsuite", "rg-hard", "bfcl:base,miss_func", "envs:dir")
    assert runner.EvalConfig(suites="gymnax,typo").specs == ("gymnax", "typo")  # unknown, said so when built


def test_envs_suite_scores_a_won_episode_1_and_a_lost_one_0(heldout):
    suite = make_suite(f"envs:{heldout}", None, runner.EvalConfig(plays_per_program=2))
    item = Item("arithmetic/seed1", "arithmetic", program="x", seed=1)

    def played(won, reward):
        return Trajectory(EpisodeRequest(0, "x", 1), np.zeros(1, np.int32), np.zeros(1, bool), np.zeros(1, np.float32),
                          reward, won, 1, "terminated", None, [])

    assert suite.score(item, played(True, 1.0), Context()) == Score(1.0, True, {"reward": 1.0, "turns": 1,
                                                                                "end": "terminated"})
    assert suite.score(item, played(False, -1.0), Context()).value == 0.0


def test_envs_suite_admits_with_the_runs_admission_config(heldout):
    strict = runner.EvalConfig(admission=AdmissionConfig(max_code_chars=200))
    suite = make_suite(f"envs:{heldout}", None, strict)
    assert suite.items(None, 0) == []
    assert len(suite.notes) == 3 and all("not admitted" in note for note in suite.notes)
    # the turn bound is the evaluation's, not the training agent's (a 1-turn agent would reject tallest)
    one_turn_agent = AdmissionConfig(max_turns=1)
    roomy = make_suite(f"envs:{heldout / 'tallest.py'}", None, runner.EvalConfig(admission=one_turn_agent, default_turns=8))
    assert {i.group for i in roomy.items(None, 0)} == {"tallest"}
    tight = make_suite(f"envs:{heldout / 'tallest.py'}", None, runner.EvalConfig(admission=one_turn_agent, default_turns=1))
    assert tight.items(None, 0) == [] and "feasibility" in tight.notes[0]


def test_envs_suite_takes_a_list_of_program_files(heldout):
    cfg = runner.EvalConfig(suites=f"envs:{heldout / 'tallest.py'},{heldout / 'broken.py'}", plays_per_program=2)
    (spec,) = cfg.specs
    suite = make_suite(spec, None, cfg)
    items = suite.items(None, 0)
    assert suite.name == "envs-tallest+broken" and {i.group for i in items} == {"tallest"} and len(items) == 2
    assert suite.notes == ["broken.py: not admitted (" + suite.notes[0].split("(", 1)[1]]
    with pytest.raises(SuiteUnavailable, match="nope.py"):
        make_suite(f"envs:{heldout / 'nope.py'}", None, cfg)


def test_the_eval_config_carries_the_runs_admission_and_sandbox():
    c = config_lib.base_config()
    c.admission.max_code_chars = 1234
    c.sandbox.call_timeout_s = 7.0
    admission = config_lib.eval_config(c).admission
    assert admission.max_code_chars == 1234 and admission.sandbox.call_timeout_s == 7.0
    assert "admission" not in c.eval


def test_envs_suite_end_to_end_is_reproducible_and_lists_its_items_once(heldout, policy, tmp_path, monkeypatch):
    listed = []
    original = EnvironmentSuite.items
    monkeypatch.setattr(EnvironmentSuite, "items", lambda self, *a: listed.append(a) or original(self, *a))
    cfg = runner.EvalConfig(suites=f"envs:{heldout}", plays_per_program=2, default_turns=4, seed=3)
    agent = AgentConfig(max_turns=2, max_new_tokens=8, context_budget=768)
    evaluator = runner.Evaluator(cfg)
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        first = evaluator.run(policy, pool, agent, tmp_path / "a", progress=False)
        again = evaluator.run(policy, pool, agent, tmp_path / "b", progress=False)
    assert listed == [(None, 3)]
    (result,) = first
    summary = result.summary
    assert summary["items"] == 4 and set(summary["groups"]) == {"arithmetic", "tallest"}
    assert 0.0 <= summary["score"] <= 1.0 and -1.0 <= summary["mean_reward"] <= 1.0
    assert any("broken.py: not admitted" in note for note in summary["notes"])
    for suffix in (".jsonl", ".json", ".md"):
        assert (tmp_path / "a" / f"{result.name}{suffix}").exists()
    rows = [json.loads(line) for line in (tmp_path / "a" / f"{result.name}.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(isinstance(r["output"], list) for r in rows)
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_s"}  # noqa: E731
    assert strip(again[0].summary) == strip(summary)
    assert (tmp_path / "a" / f"{result.name}.jsonl").read_text() == (tmp_path / "b" / f"{result.name}.jsonl").read_text()
    assert runner.metrics(first)[f"eval/{result.name}/score"] == summary["score"]


def test_a_sampled_temperature_scores_greedy_suites_again_sampled_on_the_same_items(heldout, policy, tmp_path):
    cfg = runner.EvalConfig(suites=f"envs:{heldout / 'tallest.py'}", plays_per_program=2, default_turns=8,
                            sampled_temperature=1.0)
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        greedy, sampled = runner.run_suites(policy, pool, cfg, AgentConfig(max_turns=2, max_new_tokens=8,
                                                                           context_budget=768), tmp_path, progress=False)
    assert (greedy.name, sampled.name) == ("envs-tallest", "envs-tallest-sampled")
    assert greedy.summary["settings"]["temperature"] == 0.0 and sampled.summary["settings"]["temperature"] == 1.0
    assert greedy.summary["items"] == sampled.summary["items"] == 2
    rows = [[json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
            for name in (greedy.name, sampled.name)]
    assert [r["item_id"] for r in rows[0]] == [r["item_id"] for r in rows[1]]
    assert {"eval/envs-tallest/score", "eval/envs-tallest-sampled/score"} <= set(runner.metrics([greedy, sampled]))
    with pytest.raises(ValueError, match="out of range"):
        runner.EvalConfig(sampled_temperature=-1.0)


def test_a_suite_that_cannot_run_says_why_and_the_others_run(heldout, policy, tmp_path, capsys):
    cfg = runner.EvalConfig(suites=f"envs:{tmp_path / 'missing'},envs:{heldout}", plays_per_program=1, default_turns=1,
                            limit=1)
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        results = runner.run_suites(policy, pool, cfg, AgentConfig(max_turns=1, max_new_tokens=4), tmp_path,
                                    progress=False)
    assert results[0].summary is None and "not a directory" in results[0].unavailable
    assert results[1].summary["items"] == 1
    assert "skipped" in capsys.readouterr().out
    assert "skipped" in runner.table(results) and f"| envs:{heldout} | 1 |" in runner.table(results)
    with pytest.raises(ValueError, match="unknown suite"):
        make_suite("no-such-suite", None, cfg)
    assert "envs" in registered()


def _run(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_evaluates_initial_weights_and_writes_a_table(runlocal_config, heldout, tmp_path):
    out = _run("spade_jax.evals", f"--config={runlocal_config(1)}", f"--workdir={tmp_path}",
               f"--suites=envs:{heldout},envs:{tmp_path / 'nowhere'}", "--limit=2", "--config.log.progress=False")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| suite | items |" in out.stdout and "skipped" in out.stdout
    summaries = list((tmp_path / "evals" / "initial").glob("*.json"))
    assert len(summaries) == 1 and json.loads(summaries[0].read_text())["items"] == 2


def _comparable(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or "per_s" in k or k.endswith("time_s"))}
            for r in rows]


def test_main_job_evaluates_every_iteration_and_resumes_exactly(runlocal_config, heldout, tmp_path):
    flags = [f"--config.eval.suites=envs:{heldout}", "--config.eval.every=1", "--config.eval.limit=2",
             "--config.eval.default_turns=1"]
    straight = _run("spade_jax.main", f"--config={runlocal_config(2)}", f"--workdir={tmp_path / 'a'}", *flags)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    first = _run("spade_jax.main", f"--config={runlocal_config(1)}", f"--workdir={tmp_path / 'b'}", *flags)
    resumed = _run("spade_jax.main", f"--config={runlocal_config(2)}", f"--workdir={tmp_path / 'b'}", *flags)
    assert first.returncode == 0 and resumed.returncode == 0, resumed.stdout + resumed.stderr
    metrics = _comparable(tmp_path / "a" / "metrics.jsonl")
    assert metrics == _comparable(tmp_path / "b" / "metrics.jsonl")
    name = f"envs-{heldout.name}"
    assert all(0.0 <= row[f"eval/{name}/score"] <= 1.0 for row in metrics)
    assert (tmp_path / "a" / "evals" / "1" / f"{name}.json").exists()
    assert (tmp_path / "a" / "evals" / "2" / f"{name}.json").exists()


def test_the_gallery_plots_held_out_scores_when_a_run_has_them(tmp_path):
    from spade_jax.selfplay import plots

    rows = [{"iteration": 0, "eval/envs-x/score": 0.5, "eval/envs-x/arithmetic/score": 0.25}, {"iteration": 1}]
    assert plots.family_plots([{"iteration": 0, "train/loss": 1.0}]) == ()
    (scores,) = plots.family_plots(rows)
    assert scores.name == "eval_scores" and scores.series == (("eval/envs-x/score", "envs-x"),)
    written = dict((plot.name, name) for plot, name in plots.write_plots(rows, tmp_path))
    assert (tmp_path / written["eval_scores"]).stat().st_size > 0


def test_the_gallery_plots_rejections_by_stage_and_skills_when_a_run_has_them(tmp_path):
    from spade_jax.selfplay import plots

    rows = [{"iteration": 0, "designer/rejected/load": 2, "designer/rejected/novelty": 1,
             "skill/optimization/plain_win_rate": 0.5, "skill/optimization/regret": 0.1,
             "skill/memory_recall/plain_win_rate": 0.0}]
    found = {plot.name: plot for plot in plots.family_plots(rows)}
    assert found["rejections"].stacked and [label for _, label in found["rejections"].series] == ["load", "novelty"]
    assert [label for _, label in found["skill_win_rate"].series] == ["memory_recall", "optimization"]
    assert [label for _, label in found["skill_regret"].series] == ["optimization"]
    written = dict((plot.name, name) for plot, name in plots.write_plots(rows, tmp_path))
    assert all((tmp_path / written[name]).stat().st_size > 0 for name in found)


def test_episode_progress_counts_every_episode_failed_starts_included(policy):
    from spade_jax.agent import play_episodes

    told = []
    requests = [EpisodeRequest(0, BROKEN, 1), EpisodeRequest(1, library.load_source("arithmetic"), 2)]
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        trajectories = play_episodes(policy, pool, requests, AgentConfig(max_turns=2, max_new_tokens=4),
                                     progress=told.append)
    assert trajectories[0].end_reason == "error" and sum(told) == len(requests)


class _RecordingPool:
    """Episode calls of a one-step game that records the actions it is given."""

    def __init__(self):
        self.actions = []

    def start(self, specs):
        return [StepResult(i, observation="Say something long.") for i, _ in enumerate(specs)]

    def step(self, episode_ids, actions):
        self.actions += actions
        return [StepResult(i, observation="over", terminated=True, turn=1) for i in episode_ids]

    def solution(self, episode_ids):
        return [None for _ in episode_ids]

    def close(self, episode_ids):
        pass


def test_read_action_hands_the_pool_whole_replies_instead_of_the_parsed_action(small_tokenizer, canned_sampler):
    reply = " ".join(f"word{i}" for i in range(150)) + " \\boxed{7}"
    sample = canned_sampler(small_tokenizer.encode(reply))

    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    request = [EpisodeRequest(0, "game", 0)]
    parsed, whole = _RecordingPool(), _RecordingPool()
    play_episodes(policy, parsed, request, AgentConfig(max_turns=1, context_budget=4096), sample=sample)
    play_episodes(policy, whole, request, AgentConfig(max_turns=1, context_budget=4096), sample=sample,
                  read_action=lambda text: text)
    assert parsed.actions == ["\\boxed{7}"]
    assert len(whole.actions[0]) > 1000 and whole.actions[0].endswith("\\boxed{7}")


def test_the_runner_plays_a_suites_episodes_under_its_system_prompt_and_action_reader(policy, tmp_path):
    recording = _RecordingPool()

    class Suite:
        name = "recorded"
        settings = GenerationSettings(max_new_tokens=8)
        system_prompt = "Benchmark rules."

        def items(self, limit, seed):
            return [Item("only", program="game", max_turns=1)]

        def episode_pool(self, context):
            return recording

        @staticmethod
        def read_action(reply):
            return "whole:" + reply

        def score(self, item, trajectory, context):
            return Score(0.0, False, {"messages": trajectory.messages})

    result = runner.run_suite(policy, None, Suite(), runner.EvalConfig(), AgentConfig(context_budget=1024), tmp_path,
                              progress=False)
    row = json.loads((tmp_path / "recorded.jsonl").read_text())
    assert result.summary["items"] == 1 and row["output"][0] == {"role": "system", "content": "Benchmark rules."}
    assert recording.actions == ["whole:" + row["output"][2]["content"]]


class _ChatSuite:
    """A suite of chats ``prompts`` (texts); ``fail``: its scoring raises."""

    def __init__(self, name, prompts, max_new_tokens, fail=False):
        self.name, self.prompts, self.fail = name, prompts, fail
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens)

    def items(self, limit, seed):
        return [Item(f"{self.name}/{i}", messages=({"role": "user", "content": p},)) for i, p in enumerate(self.prompts)]

    def score(self, item, reply, context):
        if self.fail:
            raise RuntimeError("the checker broke\non two lines")
        return Score(0.0, False, {"chars": len(reply)})


def test_reply_budgets_are_fitted_to_the_room_each_prompt_leaves(small_tokenizer, tmp_path):
    """A 160-position model, 64-token replies asked: a short prompt gets them all, a long one the room
    it leaves (recorded in its details and the summary), one that fills the model none (it scores 0
    with the reason, unsampled) instead of the engine raising for the whole suite."""
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=160)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    words = "the quick brown fox jumps over the lazy dog "
    prompts = ["hello", words * 3, words * 40]
    lengths = [len(small_tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
               for p in prompts]
    assert lengths[0] + 64 <= 160 < lengths[1] + 64 and lengths[1] < 160 <= lengths[2]
    suite = _ChatSuite("fit", prompts, 64)
    result = runner.run_suite(policy, None, suite, runner.EvalConfig(), AgentConfig(), tmp_path, progress=False)
    assert result.summary["reply_budget"] == {"requested": 64, "used_min": 160 - lengths[1], "clamped": 1,
                                              "no_room": 1, "max_positions": 160}
    rows = [json.loads(line) for line in (tmp_path / "fit.jsonl").read_text().splitlines()]
    assert "max_new_tokens" not in rows[0]["details"] and rows[1]["details"]["max_new_tokens"] == 160 - lengths[1]
    assert rows[2]["score"] == 0.0 and rows[2]["output"] == ""
    assert rows[2]["details"]["error"] == f"no room to reply: the prompt's {lengths[2]} tokens fill the model's 160 positions"
    assert "1 replies clamped to as few as" in runner.table([result]) and "1 without room" in runner.table([result])


def test_a_suite_that_fails_while_running_is_one_line_and_the_others_run(policy, tmp_path, monkeypatch, capsys):
    suites = {"gpqa:a": _ChatSuite("a", ["hi"], 4, fail=True), "gpqa:b": _ChatSuite("b", ["hi"], 4)}
    monkeypatch.setattr(runner, "make_suite", lambda spec, settings, cfg: suites[spec])
    results = runner.run_suites(policy, None, runner.EvalConfig(suites="gpqa:a,gpqa:b"), AgentConfig(), tmp_path,
                                progress=False)
    assert results[0].summary is None and results[0].error == "RuntimeError: the checker broke on two lines"
    assert results[1].summary["items"] == 1
    out = capsys.readouterr().out
    assert "eval gpqa:a: failed: RuntimeError: the checker broke on two lines\n" in out
    assert "| gpqa:a | - | - | - | - | failed: RuntimeError: the checker broke on two lines |" in runner.table(results)
    assert set(runner.metrics(results)) == {"eval/b/score", "eval/b/solved", "eval/b/pass@1"}
