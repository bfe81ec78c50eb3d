"""ACEBench suite (`spade_jax.evals.suites.acebench`): prompts, parsing, upstream's scoring rules.

Runs on the hand-written fixture in tests/evals/fixtures/acebench; where the shared English copy of
the data exists (/work/shared/data/acebench_en), also replays every normal and special answer.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import GenerationSettings, SuiteUnavailable
from spade_jax.evals.suites import acebench

FIXTURE = Path(__file__).parent / "fixtures" / "acebench"
SHARED = Path("/work/shared/data/acebench_en")


@dataclasses.dataclass(frozen=True)
class _Config:  # the fields of evals.runner.EvalConfig the suite reads
    limit: int = 0
    seed: int = 0
    acebench_dir: str = ""


@pytest.fixture(scope="module")
def suite():
    return acebench.make(str(FIXTURE), GenerationSettings(), _Config())


def _item(suite, item_id):
    return next(i for i in suite.items(0, 0) if i.item_id == item_id)


def _replay_all(suite):
    failures = []
    items = suite.items(0, 0)
    for item in items:
        score = suite.score(item, acebench.answer_as_reply(item.group, item.reference.ground_truth), None)
        if score.value != 1.0 or not score.solved or score.details.get("scalars_match") is False:
            failures.append((item.item_id, score.details))
    return items, failures


def test_every_possible_answer_of_the_fixture_scores_one(suite):
    items, failures = _replay_all(suite)
    assert not failures
    groups = {i.group for i in items}
    assert "agent_multi_step" not in groups and len(items) == 10
    assert groups == {"normal_single_turn_single_function", "normal_single_turn_parallel_function",
                      "normal_multi_turn_user_adjust", "normal_atom_bool", "normal_preference",
                      "special_incomplete", "special_error_param", "special_irrelevant"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared copy of the ACEBench data")
def test_every_possible_answer_of_the_shared_copy_scores_one():
    suite = acebench.make(str(SHARED), GenerationSettings(), _Config())
    items, failures = _replay_all(suite)
    assert len(items) == 973 and not failures, failures[:3]
    assert {i.group for i in items} == set(acebench.CATEGORIES)


def test_messages_are_upstreams_prompts(suite):
    item = _item(suite, "normal_single_turn_single_function_0")
    system, user = item.messages
    row = json.loads((FIXTURE / "data_normal_single_turn_single_function.json").read_text().splitlines()[0])
    assert system["role"] == "system" and user["role"] == "user"
    assert system["content"] == acebench.SYSTEM_PROMPT_FOR_NORMAL_DATA_EN.format(time=row["time"], function=row["function"])
    assert str(row["function"]) in system["content"] and "Today is 2024-05-01" in system["content"]
    assert user["content"] == "Conversation history 1..t:\n" + row["question"]
    special = _item(suite, "special_incomplete_0").messages[0]["content"]
    assert "Missing necessary parameters (key1, key2, ...)" in special
    preference = _item(suite, "normal_preference_0").messages[0]["content"]
    assert "Character Profile:\n{'basic_features'" in preference


@pytest.mark.parametrize("item_id, reply, error_type", [
    # wrong function name
    ("normal_single_turn_single_function_0", "[WeatherPlanner_forecastX(city='New York')]", "function_mismatch"),
    # wrong string value
    ("normal_single_turn_single_function_0",
     "[WeatherPlanner_forecast(city='Boston', days=3, include_hourly=True, units='metric', location={'lat': 40.71, 'lon': -74.0})]",
     "value_error:string"),
    # wrong value inside an object
    ("normal_single_turn_single_function_0",
     "[WeatherPlanner_forecast(city='New York', location={'lat': 41.5, 'lon': -74.0})]", "value_error"),
    # wrong list
    ("normal_single_turn_single_function_1", "[TripPacker_makeList(activities=['hiking'])]", "value_error:list/tuple"),
    # a parameter the answer does not have
    ("normal_single_turn_single_function_0", "[WeatherPlanner_forecast(city='New York', wind=True)]", "addition_args"),
    # a required parameter missing
    ("normal_single_turn_single_function_1", "[TripPacker_makeList(travellers=[])]", "lack_args"),
    # a type the schema does not allow
    ("normal_single_turn_single_function_0", "[WeatherPlanner_forecast(city='New York', days='three')]", "type_error"),
    # a call missing from parallel calls
    ("normal_single_turn_parallel_function_0",
     "[HistoryTimeline_fetch(region='Spain', period={'start_year': 700, 'end_year': 1500}), WeatherPlanner_forecast(city='Lisbon')]",
     "wrong functions number"),
    # the right count but one function twice
    ("normal_single_turn_parallel_function_0",
     "[HistoryTimeline_fetch(region='Spain'), HistoryTimeline_fetch(region='Spain'), WeatherPlanner_forecast(city='Lisbon')]",
     "value_error:string"),
    ("normal_single_turn_single_function_0", "[]", "wrong functions number"),
    # text that is not a call
    ("normal_single_turn_single_function_0", "The weather in New York will be sunny.", "wrong_output_format"),
    ("normal_single_turn_single_function_0", "[the weather is sunny]", "wrong_output_format"),
    ("normal_single_turn_single_function_0", "[WeatherPlanner_forecast(city='New York'", "wrong_output_format"),
    # multi-turn: upstream parses the whole reply, so text around the calls fails
    ("normal_multi_turn_user_adjust_0_1",
     "Sure: [vr_tour_create(site='Colosseum', platform={'hardware': ['Oculus Rift'], 'software': ['Unity']})]",
     "wrong_output_format"),
    ("normal_multi_turn_user_adjust_0_1",
     "[vr_tour_create(site='Colosseum', platform={'hardware': ['HTC Vive'], 'software': ['Unity']})]", "value_error"),
    # special categories
    ("special_incomplete_0", "[TripPacker_makeList()]", "error_detection"),
    ("special_incomplete_0", '["Missing necessary parameters (activities) for the api (WeatherPlanner_forecast)"]',
     "error_correction"),
    ("special_incomplete_0", '["Missing necessary parameters (travellers) for the api (TripPacker_makeList)"]',
     "error_correction"),
    ("special_error_param_0", "[AccountLookup(email='bob@@example.com', year=1999)]", "error_detection"),
    ("special_error_param_0", '["There is incorrect value (bob@@example.com) for the parameters (email)."]',
     "error_correction"),
    ("special_irrelevant_0", "[TripPacker_makeList(activities=['eclipse watching'])]", "error_detection"),
])
def test_wrong_answers_score_zero_with_a_reason(suite, item_id, reply, error_type):
    score = suite.score(_item(suite, item_id), reply, None)
    assert score.value == 0.0 and not score.solved
    assert score.details["valid"] is False and score.details["error"]
    assert score.details["error_type"] == error_type, score.details
    json.dumps(score.details)


@pytest.mark.parametrize("item_id, reply", [
    # upstream's leniencies: strings contained after normalising, text around the list, optional
    # parameters left out, either alternative answer, true/false, parallel calls in any order
    ("normal_single_turn_single_function_0",
     "Here: [WeatherPlanner_forecast(city='new-york city', days=3, include_hourly=true, units='Metric', location={'lat': 40.71, 'lon': -74.0})] done"),
    ("normal_single_turn_single_function_0", "[WeatherPlanner_forecast(city='New York')]"),
    ("normal_atom_bool_0", "[WeatherPlanner_forecast(city='Oslo', include_hourly=True, days=1)]"),
    ("normal_single_turn_parallel_function_0",
     "[WeatherPlanner_forecast(city='Lisbon'), HistoryTimeline_fetch(region='Spain', period={'start_year': 700, 'end_year': 1500}), "
     "HistoryTimeline_fetch(region='Eastern Europe', period={'start_year': 1500, 'end_year': 1800}, events=[])]"),
    ("normal_multi_turn_user_adjust_0_1",
     "[vr_tour_create(site = 'Colosseum',\n platform = {'hardware': ['Oculus Rift'], 'software': ['Unity']})]"),
    ("special_irrelevant_0", "Due to the limitations of the function, I cannot solve this problem."),
])
def test_replies_upstream_accepts_score_one(suite, item_id, reply):
    score = suite.score(_item(suite, item_id), reply, None)
    assert score.value == 1.0 and score.solved, score.details


def test_numbers_and_booleans_are_checked_by_type_only_as_upstream_does(suite):
    item = _item(suite, "normal_single_turn_single_function_0")
    right = suite.score(item, acebench.answer_as_reply(item.group, item.reference.ground_truth), None)
    flipped = suite.score(item, "[WeatherPlanner_forecast(city='New York', days=30, include_hourly=False)]", None)
    assert right.details["scalars_match"] is True
    assert flipped.value == 1.0 and flipped.details["scalars_match"] is False
    assert any("scalars_match" in note for note in suite.notes)


def test_replies_are_parsed_without_running_them(suite, tmp_path):
    item = _item(suite, "normal_single_turn_single_function_0")
    marker = tmp_path / "ran"
    for reply in [f"[WeatherPlanner_forecast(city=__import__('pathlib').Path({str(marker)!r}).touch() + 'x')]",
                  "[WeatherPlanner_forecast(city='New York', days=9**9**9)]",
                  "[WeatherPlanner_forecast(city='a' * 10**9)]",
                  "[WeatherPlanner_forecast(city=lambda: 1)]",
                  "[" * 5000 + "]" * 5000]:
        score = suite.score(item, reply, None)
        assert score.value == 0.0 and score.details["error_type"] == "wrong_output_format", score.details
    assert not marker.exists()
    assert acebench.parse_calls("[f(a=2*3+1, b=-2.5, c=x, d=g(), e=h(k=1), f=(1, 2), s='a' + 'b')]") == [
        {"f": {"a": 7, "b": -2.5, "c": "x", "d": {"g": {}}, "e": {"h": {"k": 1}}, "f": (1, 2), "s": "ab"}}]
    assert acebench.without_whitespace(" [f(a = 'x y', b=\"p 'q\\\" r\")]\n") == "[f(a='x y',b=\"p 'q\\\" r\")]"


def test_same_seed_same_items_and_a_spread_across_categories():
    suite = acebench.make(str(FIXTURE), GenerationSettings(), _Config())
    ids = [i.item_id for i in suite.items(5, seed=3)]
    assert ids == [i.item_id for i in suite.items(5, seed=3)]
    assert len(ids) == 5 and len({i.group for i in suite.items(5, seed=3)}) == 5
    every = suite.items(8, seed=1)
    assert len({i.group for i in every}) == 8  # one per category
    assert [i.item_id for i in suite.items(0, seed=1)] == [i.item_id for i in suite.items(100, seed=7)]
    assert len({tuple(i.item_id for i in suite.items(9, seed=s)) for s in range(8)}) > 1


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared copy of the ACEBench data")
def test_limit_on_the_shared_copy_spreads_across_categories():
    suite = acebench.make(str(SHARED), GenerationSettings(), _Config())
    picked = suite.items(30, seed=0)
    assert [i.item_id for i in picked] == [i.item_id for i in suite.items(30, seed=0)]
    assert [i.item_id for i in picked] != [i.item_id for i in suite.items(30, seed=1)]
    assert sorted({i.group for i in picked}) == sorted(acebench.CATEGORIES)


def test_missing_data_is_a_one_line_unavailable(tmp_path):
    for argument, config in [("", _Config()), (str(tmp_path / "nowhere"), _Config()),
                             ("", _Config(acebench_dir=str(tmp_path))), (str(tmp_path), _Config())]:
        with pytest.raises(SuiteUnavailable) as err:
            acebench.make(argument, GenerationSettings(), config)
        message = str(err.value)
        assert "\n" not in message and "github.com/chenchen0103/ACEBench" in message and "acebench:" in message


def test_the_registry_finds_the_suite_and_the_config_directory_is_used(tmp_path):
    assert "acebench" in registered()
    entry = registered()["acebench"]
    assert entry.settings.temperature == 0.0 and entry.settings.max_new_tokens == 1024
    suite = make_suite("acebench", None, _Config(acebench_dir=str(FIXTURE)))
    assert suite.name == "acebench" and len(suite.items(0, 0)) == 10
    # a clone of the repository (data_all/data_en) is found from its root
    shutil.copytree(FIXTURE, tmp_path / "ACEBench" / "data_all" / "data_en")
    cloned = acebench.make(str(tmp_path / "ACEBench"), GenerationSettings(), _Config())
    assert cloned.directory == tmp_path / "ACEBench" / "data_all" / "data_en" and len(cloned.items(0, 0)) == 10


def test_runs_end_to_end_with_a_tiny_random_policy(tmp_path, small_tokenizer):
    import jax

    from spade_jax.agent import AgentConfig
    from spade_jax.evals.runner import EvalConfig, run_suite
    from spade_jax.models import ModelConfig, make_mesh, random_policy

    arch = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(arch, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    cfg = EvalConfig(suites=f"acebench:{FIXTURE}", limit=4, seed=0, batch_size=4)
    suite = make_suite(cfg.specs[0], GenerationSettings(max_new_tokens=4), cfg)
    result = run_suite(policy, None, suite, cfg, AgentConfig(), tmp_path, progress=False, spec=cfg.specs[0])
    summary = result.summary
    assert summary["items"] == 4 and 0.0 <= summary["score"] <= 1.0
    assert all(0.0 <= block["score"] <= 1.0 for block in summary["groups"].values())
    rows = [json.loads(line) for line in (tmp_path / "acebench.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(0.0 <= r["score"] <= 1.0 and "category" in r["details"] for r in rows)
    assert (tmp_path / "acebench.json").is_file() and (tmp_path / "acebench.md").is_file()


def test_a_reply_with_values_json_cannot_hold_is_scored_not_raised(suite):
    reply = "[WeatherPlanner_forecast(city={(1, 2): 3}, days=1j, units=b'x')]"
    score = suite.score(_item(suite, "normal_single_turn_single_function_0"), reply, None)
    assert score.value == 0.0
    json.dumps(score.details)


@pytest.mark.parametrize("reply", [
    "[login_device(), view_reminder_by_title(title=[[[0]*10000]*10000]*10)]",  # 10^9 elements in 70 characters
    "[f(a=[['x' * 10000] * 10000])]",
    "[f(a=[0]*9000 + [0]*9000)]",
    "[f(a=[0]*9000, b=[0]*9000, c=[0]*9000, d=[0]*9000, e=[0]*9000, f=[0]*9000, g=[0]*9000, h=[0]*9000, "
    "i=[0]*9000, j=[0]*9000, k=[0]*9000, l=[0]*9000)]",
])
def test_a_literal_is_bounded_by_its_total_size_not_each_product(reply):
    """Each product of these is within the per-product bound; what they build, nested or added up, is not."""
    from spade_jax.evals import bounded

    try:
        calls = acebench.parse_calls(reply)
    except acebench.ParseError as err:
        assert "too large" in str(err)
        return
    pytest.fail(f"parsed into {bounded.literal_size(calls)} elements and characters")


def test_small_products_still_parse():
    assert acebench.parse_calls("[f(a=[0]*3, b='ab'*2, c=[[1]*2]*2)]") == [{"f": {"a": [0, 0, 0], "b": "abab",
                                                                                  "c": [[1, 1], [1, 1]]}}]
    assert acebench.parse_calls("[f(a=[0]*10000)]")[0]["f"]["a"] == [0] * 10000
