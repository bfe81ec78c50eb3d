"""BFCL-v4 multi-turn (`bfcl` suite): the package's ground truth replayed through the pool scores
valid, wrong play scores 0, hostile replies run nothing, and a tiny policy plays end to end."""

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from spade_jax.agent import AgentConfig
from spade_jax.agent.actions import MAX_RAW_ACTION_CHARS
from spade_jax.evals import runner
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import GenerationSettings, SuiteUnavailable
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.evals.suites import bfcl
from spade_jax.sandbox.records import EpisodeSpec


@dataclasses.dataclass(frozen=True)
class _Config:  # the fields of evals.runner.EvalConfig the suite reads
    limit: int = 0
    seed: int = 0


@pytest.fixture(scope="module")
def suite():
    return bfcl.make("", GenerationSettings(), _Config())


def _item(suite, entry_id):
    return next(i for i in suite.all_items() if i.item_id == entry_id)


def _play(suite, entry_id, replies):
    """Plays ``replies`` (until the episode ends) through a fresh pool as the engine does, and scores it."""
    pool = suite.episode_pool(None)
    (start,) = pool.start([EpisodeSpec(program=entry_id, seed=0)])
    messages, results = [], [start]
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        (result,) = pool.step([start.episode_id], [suite.read_action(reply)])
        results.append(result)
        if result.done:
            break
    pool.close([start.episode_id])
    end = "terminated" if results[-1].terminated else "max_turns"
    return results, suite.score(_item(suite, entry_id), SimpleNamespace(messages=messages, end_reason=end))


def _ground_truth_replies(suite, entry_id):
    """Each turn's ground-truth calls as one reply (none for a turn without), then a reply that ends the turn."""
    return [reply for turn in suite.truth[entry_id]
            for reply in (["[" + ", ".join(turn) + "]"] if turn else []) + ["Done."]]


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_the_ground_truth_replayed_through_the_pool_is_valid_on_every_item(suite, category):
    """Every item; long_context's include replies far longer than the engine passes sandbox
    environments (MAX_RAW_ACTION_CHARS), which this suite takes whole."""
    items = [i for i in suite.all_items() if i.group == category]
    assert len(items) == 200
    failures = []
    for item in items:
        results, score = _play(suite, item.item_id, _ground_truth_replies(suite, item.item_id))
        if not (results[-1].terminated and score.solved and score.value == 1.0):
            failures.append((item.item_id, score.details.get("error_type"), score.details.get("error")))
        assert not any(r.observation.startswith("Error:") for r in results)
    assert not failures
    longest = max(len(r) for i in items for r in _ground_truth_replies(suite, i.item_id))
    assert (longest > MAX_RAW_ACTION_CHARS) == (category == "long_context")
    assert not [k for k in vars(suite.bfcl.execution) if k.startswith("spadejax_bfcl_")], "instances left cached"


def test_no_calls_or_a_wrong_argument_scores_zero(suite):
    entry_id = "multi_turn_base_0"
    truth = suite.truth[entry_id]
    _, silent = _play(suite, entry_id, ["I cannot help."] * len(truth))
    assert silent.value == 0.0 and silent.details["error_type"] == "multi_turn:empty_turn_model_response"
    wrong = _ground_truth_replies(suite, entry_id)
    assert wrong[0].count("mkdir(dir_name='temp')") == 1
    wrong[0] = wrong[0].replace("mkdir(dir_name='temp')", "mkdir(dir_name='tmp')")
    results, score = _play(suite, entry_id, wrong)
    assert results[-1].terminated and score.value == 0.0 and not score.solved
    assert score.details["error_type"] == "multi_turn:instance_state_mismatch"
    assert score.details["calls"][0][0][1] == "mkdir(dir_name='tmp')"
    _, unfinished = _play(suite, entry_id, _ground_truth_replies(suite, entry_id)[:-1])
    assert unfinished.value == 0.0 and unfinished.details["error_type"] == bfcl.FORCE_TERMINATED


def test_the_first_observation_and_the_held_out_functions_follow_upstream(suite):
    entry_id = "multi_turn_miss_func_0"
    entry = suite.entries[entry_id]
    (held_turn, held), = entry["missed_function"].items()
    assert [d["name"] for d in held] == ["sort"] and held_turn == "3"
    assert "sort" not in {d["name"] for d in entry["function"]}
    results, score = _play(suite, entry_id, _ground_truth_replies(suite, entry_id))
    first = results[0].observation
    assert first.startswith("You are an expert in composing functions.You are given a question")
    assert "[func_name1(params_name1=params_value1" in first and entry["question"][0][0]["content"] in first
    revealed = [r.observation for r in results if "I have updated some more functions" in r.observation]
    assert len(revealed) == 1 and "'name': 'sort'" in revealed[0]
    assert score.solved


def test_hostile_replies_are_refused_and_nothing_runs(suite, tmp_path):
    marker = tmp_path / "x"
    entry_id = "multi_turn_base_0"
    pool = suite.episode_pool(None)
    (start,) = pool.start([EpisodeSpec(program=entry_id, seed=0)])
    hostile = [f"[__import__('os').system('touch {marker}')]", "[open('/etc/passwd')]",
               f"[cd(folder='document'), mkdir(dir_name=__import__('os').system('touch {marker}'))]",
               "[mkdir(dir_name='a' + 'b')]", "[mkdir(**{'dir_name': 'x'})]", "[os.system('ls')]",
               "[power(base=7, exponent=10000000)]", "[tail(file_name='a', lines=10**9)]",
               "[tail(file_name='a', lines=1000000000)]"]
    for reply in hostile:
        (result,) = pool.step([start.episode_id], [reply])
        assert result.observation.startswith("Error:") and "Nothing was executed" in result.observation, reply
        assert not result.done
    assert not marker.exists()
    (result,) = pool.step([start.episode_id], ["[pwd()]"])
    assert result.observation == ("[{'role': 'tool', 'name': 'pwd()', "
                                  "'content': '{\"current_working_directory\": \"/workspace\"}'}]")
    pool.close([start.episode_id])
    transcript = suite.transcript(entry_id, hostile + ["[pwd()]"])
    assert transcript.turns == [[["pwd()"]]]


def test_the_step_limit_ends_the_episode_and_fails_it(suite):
    entry_id = "multi_turn_base_0"
    limit = suite.bfcl.prompts.MAXIMUM_STEP_LIMIT
    results, score = _play(suite, entry_id, ["[pwd()]"] * (limit + 5))
    assert len(results) == limit + 2 and results[-1].terminated and "forced to quit" in results[-1].observation
    assert score.value == 0.0 and score.details["error_type"] == bfcl.FORCE_TERMINATED
    assert _item(suite, entry_id).max_turns == len(suite.truth[entry_id]) * (limit + 2)


def test_subsets_limits_and_a_missing_package(suite, monkeypatch):
    assert "bfcl" in registered()
    subset = make_suite("bfcl:base,miss_func", None, runner.EvalConfig())
    assert subset.name == "bfcl-base-miss_func" and {i.group for i in subset.all_items()} == {"base", "miss_func"}
    chosen = suite.items(8, 3)
    assert chosen == suite.items(8, 3) and chosen != suite.items(8, 4)
    assert [sum(i.group == c for i in chosen) for c in bfcl.CATEGORIES] == [2, 2, 2, 2]
    with pytest.raises(SuiteUnavailable, match="unknown BFCL multi-turn category"):
        make_suite("bfcl:simple", None, runner.EvalConfig())
    root = Path(suite.bfcl.utils.PROJECT_ROOT).resolve()
    assert not root.is_relative_to(Path(suite.bfcl.utils.PACKAGE_ROOT).resolve().parent)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(SuiteUnavailable, match="pip install --no-deps bfcl-eval==2026.3.23") as err:
        make_suite("bfcl", None, runner.EvalConfig())
    assert "\n" not in str(err.value)


def test_a_tiny_policy_plays_bfcl_end_to_end(small_tokenizer, tmp_path, monkeypatch):
    """Through the runner and the engine; the function docs (42k characters) are left out of the
    prompt so that the tiny model on CPU plays every user turn in seconds."""
    monkeypatch.setattr(bfcl, "system_prompt", lambda prompts, functions: "Reply with calls such as [pwd()].")
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    cfg = runner.EvalConfig(suites="bfcl", limit=4, seed=5)
    agent = AgentConfig(context_budget=2048)
    generation = {"bfcl": GenerationSettings(max_new_tokens=8)}
    first = runner.run_suites(policy, None, cfg, agent, tmp_path / "a", generation, progress=False)
    runner.run_suites(policy, None, cfg, agent, tmp_path / "b", generation, progress=False)
    summary = first[0].summary
    assert summary["items"] == 4 and set(summary["groups"]) == set(bfcl.CATEGORIES)
    assert 0.0 <= summary["score"] <= 1.0
    rows = (tmp_path / "a" / "bfcl.jsonl").read_text()
    assert rows == (tmp_path / "b" / "bfcl.jsonl").read_text()
    assert '"end": "terminated"' in rows
    assert (tmp_path / "a" / "bfcl.md").exists() and (tmp_path / "a" / "bfcl.json").exists()


# A child process plays hostile replies on a MathAPI entry and reports, per reply, how long the
# step took, what it observed and mpmath's and decimal's precision afterwards: a call that hangs
# fails the test at the timeout instead of blocking the run.
_COSTLY_CHILD = r"""
import json, sys, time, types, decimal, mpmath
from spade_jax.evals.suite import GenerationSettings
from spade_jax.evals.suites import bfcl
from spade_jax.sandbox.records import EpisodeSpec
suite = bfcl.make("base", GenerationSettings(), types.SimpleNamespace(limit=0, seed=0))
pool = suite.episode_pool(None)
(start,) = pool.start([EpisodeSpec(program="multi_turn_base_15", seed=0)])
for reply in json.loads(sys.argv[1]):
    began = time.perf_counter()
    (result,) = pool.step([start.episode_id], [reply])
    print(json.dumps({"reply": reply, "s": time.perf_counter() - began, "observation": result.observation[:300],
                      "dps": mpmath.mp.dps, "prec": decimal.getcontext().prec}), flush=True)
"""


def _run_child(replies, timeout=60):
    import json
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", _COSTLY_CHILD, json.dumps(replies)], capture_output=True,
                              text=True, timeout=timeout, cwd=Path(__file__).parents[2])
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the replies did not return in {timeout} s; reported so far: {err.stdout}")
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_costly_parameters_as_floats_or_strings_are_refused_before_they_run():
    """The precision and exponent caps hold whatever the literal's type: a float or a numeric string
    reaches mpmath's precision as well as an int does (``precision=1000000.0`` ran for minutes)."""
    hostile = ["[logarithm(value=10.0, base=2.0, precision=1000000.0)]",
               "[logarithm(value=10.0, base=2.0, precision='20000')]",
               "[logarithm(value=10.0, base=2.0, precision=b'20000')]",
               "[logarithm(value=10.0, base=2.0, precision=' 2_0000 ')]",
               "[logarithm(10.0, 2.0, '1e6')]",
               "[logarithm(value=10.0, base=2.0, precision=float('inf'))]",
               "[square_root(number=2.0, precision=100000.0)]",
               "[round_number(number=5, decimal_places=-1000000)]"]
    for row in _run_child(hostile):
        assert row["observation"].startswith("Error:") and "Nothing was executed" in row["observation"], row
        assert row["s"] < 5 and row["dps"] == 15, row


def test_a_call_changes_no_numeric_state_of_the_process(suite):
    """Allowed precisions run, and mpmath's precision and decimal's context are what they were after
    the pool's step and after the checker's replay (the package sets both globally)."""
    import decimal

    import mpmath

    allowed = ["[logarithm(value=10.0, base=2.0, precision=500)]", "[square_root(number=2.0, precision=900)]"]
    rows = _run_child(allowed)
    assert "'result'" in rows[0]["observation"] and "Error" not in rows[0]["observation"]
    assert [(r["dps"], r["prec"]) for r in rows] == [(15, 28), (15, 28)]
    before = (mpmath.mp.prec, decimal.getcontext().prec)
    turns = len(suite.truth["multi_turn_base_15"])
    suite.check("multi_turn_base_15", [[[call[1:-1] for call in allowed]]] + [[] for _ in range(turns - 1)])
    assert (mpmath.mp.prec, decimal.getcontext().prec) == before


def test_the_arguments_of_one_reply_are_bounded_in_total_size(suite):
    parameters = bfcl._parameters(suite.entries["multi_turn_base_15"])
    numbers = "[" + ", ".join(["1.5"] * 120_000) + "]"
    with pytest.raises(bfcl.Refused, match="too large"):
        bfcl.decode_calls(f"[mean(numbers={numbers})]", parameters)
    assert bfcl.decode_calls("[mean(numbers=[1.5, 2.5])]", parameters) == ["mean(numbers=[1.5, 2.5])"]


def test_an_item_past_its_work_budget_ends_failed_with_the_reason(suite):
    from spade_jax.evals import bounded

    entry_id = "multi_turn_base_0"
    spent = dataclasses.replace(suite, work_s=0.0)
    results, _ = _play(spent, entry_id, _ground_truth_replies(suite, entry_id))
    assert len(results) == 2 and results[-1].truncated and results[-1].error.startswith(bounded.BUDGET_EXCEEDED)
    trajectory = SimpleNamespace(messages=[{"role": "assistant", "content": _ground_truth_replies(suite, entry_id)[0]}],
                                 end_reason="error", error=results[-1].error)
    scored = spent.score(_item(suite, entry_id), trajectory)
    assert scored.value == 0.0 and scored.details["error_type"] == "budget"
    assert scored.details["error"].startswith(bounded.BUDGET_EXCEEDED)
