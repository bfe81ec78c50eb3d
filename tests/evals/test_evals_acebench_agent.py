"""ACEBench agent categories (`acebench-agent` suite): the simulated APIs, the episode pool and
upstream's end-state and process scoring.

Runs on the hand-written fixture in tests/evals/fixtures/acebench/agent; where the shared English copy
of the data exists (/work/shared/data/acebench_en), also replays the answer of every agent item.
"""

import dataclasses
import json
import types
from pathlib import Path

import pytest

from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import GenerationSettings, SuiteUnavailable
from spade_jax.evals.suites import acebench_agent as agent
from spade_jax.evals.suites.acebench_apis import Scenario
from spade_jax.sandbox.records import EpisodeSpec

FIXTURE = Path(__file__).parent / "fixtures" / "acebench" / "agent"
SHARED = Path("/work/shared/data/acebench_en")

# The shared copy's milestones are not all complete solutions: 19 of the 50 items need these
# corrections to reach their own ground truth (with them, all 50 do).
REQUOTE = {"'Domino's'": "\"Domino's\"", "'Today's spending'": "\"Today's spending\"",
           "'Today's spending 88.0 yuan'": "\"Today's spending 88.0 yuan\"",
           "'Don't forget tomorrow afternoon's meeting'": "\"Don't forget tomorrow afternoon's meeting\""}
UNPARSABLE = {"agent_multi_step_4", "agent_multi_step_5"} | {f"agent_multi_turn_{i}" for i in range(8, 16)}
WRONG_PRODUCT = {"agent_multi_step_0", "agent_multi_step_1"}  # 'Super Supreme' is 'Super Supreme Pizza' on the menu
NO_FOOD_LOGIN = {"agent_multi_step_12", "agent_multi_step_13"}
NO_DEVICE_LOGIN = {"agent_multi_step_16", "agent_multi_turn_6"}
OLDEST_NOT_LATEST = {"agent_multi_step_14", "agent_multi_step_15", "agent_multi_step_16", "agent_multi_step_17"}


@dataclasses.dataclass(frozen=True)
class _Config:  # the fields of evals.runner.EvalConfig the suite reads
    limit: int = 0
    seed: int = 0
    acebench_dir: str = ""


def _suite(directory=FIXTURE):
    return agent.make(str(directory), GenerationSettings(), _Config())


def _scripted_user(chats):
    return ["I need help with my task." for _ in chats]


def _play(suite, item, replies, user=_scripted_user):
    """Plays ``replies`` through the suite's pool and scores the transcript as the runner would."""
    pool = agent.AgentPool(suite.references, user)
    (start,) = pool.start([EpisodeSpec(program=item.program)])
    assert start.ok, start.error
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": start.observation}]
    results = []
    for reply in replies:
        (result,) = pool.step([start.episode_id], [reply])
        results.append(result)
        messages.append({"role": "assistant", "content": reply})
        if result.done:
            break
        messages.append({"role": "user", "content": result.observation})
    trajectory = types.SimpleNamespace(messages=messages, turns=len(results),
                                       end_reason="terminated" if results[-1].terminated else "max_turns")
    return suite.score(item, trajectory, None), results


def _item(suite, item_id):
    return next(i for i in suite.items(0, 0) if i.item_id == item_id)


def test_the_answer_scores_one_on_every_fixture_item():
    suite = _suite()
    items = suite.items(0, 0)
    assert [i.item_id for i in items] == ["agent_multi_step_0", "agent_multi_step_1", "agent_multi_turn_0",
                                          "agent_multi_turn_1"]
    for item in items:
        score, results = _play(suite, item, agent.reference_replies(item.reference))
        assert score.value == 1.0 and score.solved, (item.item_id, score.details)
        assert score.details["process_accuracy"] == 1.0 and not score.details["diff"]
        assert results[-1].terminated and results[-1].reward == 1.0
        json.dumps(score.details)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared copy of the ACEBench data")
def test_the_answer_scores_one_on_every_item_of_the_shared_copy():
    suite = _suite(SHARED)
    items = suite.items(0, 0)
    assert len(items) == 50 and {i.group for i in items} == {"agent_multi_step", "agent_multi_turn"}
    as_given = {i.item_id for i in items if _play(suite, i, agent.reference_replies(i.reference))[0].value == 1.0}
    defects = UNPARSABLE | WRONG_PRODUCT | NO_FOOD_LOGIN | NO_DEVICE_LOGIN | OLDEST_NOT_LATEST
    assert {i.item_id for i in items} - as_given == defects and len(as_given) == 31
    for item in items:
        score, _ = _play(suite, item, _corrected(item.item_id, agent.reference_replies(item.reference)))
        assert score.value == 1.0 and score.details["process_accuracy"] == 1.0, (item.item_id, score.details["diff"])


def _corrected(item_id, replies):
    out = []
    for reply in replies:
        for wrong, right in REQUOTE.items():
            reply = reply.replace(wrong, right)
        if item_id in WRONG_PRODUCT:
            reply = reply.replace("'Super Supreme'", "'Super Supreme Pizza'")
        if item_id in OLDEST_NOT_LATEST and reply == "[delete_message(message_id=3)]":
            reply = "[delete_message(message_id=4)]"
        if item_id in NO_DEVICE_LOGIN and not out:
            out.append("[login_device()]")
        if item_id in NO_FOOD_LOGIN and reply.startswith("[add_food_delivery_order"):
            out.append("[login_food_platform(username='Helen', password='password321')]")
        out.append(reply)
    return out


@pytest.mark.parametrize("item_id, change", [
    ("agent_multi_step_0", lambda rs: [r.replace("'Eve'", "'Jack'") for r in rs]),  # the wrong recipient
    ("agent_multi_step_0", lambda rs: [r for r in rs if "delete_message" not in r]),  # the inbox stays full
    ("agent_multi_step_1", lambda rs: rs[1:]),  # never logged in to the device
    ("agent_multi_turn_0", lambda rs: [r.replace("message_id=3", "message_id=1") for r in rs]),
    ("agent_multi_turn_1", lambda rs: [r.replace("reservation_id='res_2'", "reservation_id='res_1'") for r in rs]),
])
def test_a_wrong_call_sequence_scores_zero_with_the_difference(item_id, change):
    suite = _suite()
    item = _item(suite, item_id)
    score, results = _play(suite, item, change(agent.reference_replies(item.reference)))
    assert score.value == 0.0 and not score.solved and score.details["diff"]
    assert 0.0 <= score.details["process_accuracy"] < 1.0
    assert results[-1].terminated and results[-1].reward == 0.0


def test_no_executed_reply_is_a_wrong_number_of_classes():
    suite = _suite()
    item = _item(suite, "agent_multi_step_1")
    score, _ = _play(suite, item, ["I will add it.", "Done.", agent.FINISH])
    assert score.value == 0.0 and score.details["diff"][0].startswith("wrong number of classes")
    assert score.details["executed"] == ["I will add it.", "Done."] and score.details["process_accuracy"] == 0.0


def test_adversarial_and_unknown_calls_are_refused_with_an_error_observation(tmp_path):
    suite = _suite()
    item = _item(suite, "agent_multi_step_1")
    marker = tmp_path / "ran"
    replies = [f"[__import__('os').system('touch {marker}')]", f"[os.system('touch {marker}')]",
               "[_load_scenario(config={'logged_in': True})]", "[__init__()]", "[make_coffee(size='large')]"]
    pool = agent.AgentPool(suite.references, None)
    (start,) = pool.start([EpisodeSpec(program=item.program)])
    for reply in replies:
        (result,) = pool.step([start.episode_id], [reply])
        assert result.ok and not result.done
        assert result.observation.startswith("execution result:[") and "Error during execution" in result.observation
    assert not marker.exists()
    # a call inside an argument is data, never run
    pool.step([start.episode_id], ["[login_device()]"])
    (added,) = pool.step([start.episode_id], ["[add_reminder(title=__import__('os').getcwd(), description='x', time='y')]"])
    assert "successfully added" in added.observation
    reminders = pool._episodes[start.episode_id].dialogue.scenario.state()[1]["ReminderApi"]["reminder_list"]
    assert reminders["4"]["title"] == {"getcwd": {}}
    score, _ = _play(suite, item, replies + [agent.FINISH])
    assert score.value == 0.0 and "BaseApi.logged_in is False, expected True" in score.details["diff"]


def test_what_answers_a_reply_follows_upstream():
    suite = _suite()
    pool = agent.AgentPool(suite.references, _scripted_user)
    step, turn = _item(suite, "agent_multi_step_1"), _item(suite, "agent_multi_turn_0")
    (a, b) = pool.start([EpisodeSpec(program=step.program), EpisodeSpec(program=turn.program)])
    assert a.observation.startswith(agent.MULTI_STEP_AGENT_SYSTEM_EN)
    assert a.observation.endswith(f"Conversation history: user:{step.reference.question}\n\n")
    assert str(step.reference.functions) in a.observation
    assert agent.BASE_PROMPT_EN in b.observation and b.observation.endswith("user:I need help with my task.\n")
    # the first reply never ends the episode, as upstream's ``index > 1``
    first = pool.step([a.episode_id, b.episode_id], [agent.FINISH, agent.FINISH])
    assert first[0].observation == f"execution result:{agent.NUDGE}" and not first[0].done
    assert first[1].observation == "user:I need help with my task." and not first[1].done
    empty = pool.step([a.episode_id, b.episode_id], ["[]", "[]"])  # no call: as a reply without calls
    assert empty[0].observation == f"execution result:{agent.NUDGE}" and empty[1].observation.startswith("user:")
    calls = pool.step([a.episode_id, b.episode_id], ["login_device()", "[turn_on_wifi()]"])
    assert calls[0].observation == "execution result:[{'status': True, 'message': 'Device has been logged in'}]"
    assert calls[1].observation == "execution:[{'status': True, 'message': 'Wi-Fi has been turned on'}]"
    # multi_turn: a reply without brackets is for the user, who may end the conversation (not at message 1)
    done = agent.AgentPool(suite.references, lambda chats: ["Thanks, finish conversation" for _ in chats])
    (c,) = done.start([EpisodeSpec(program=turn.program)])
    (d,) = done.step([c.episode_id], ["login_device()"])
    assert d.observation == "user:Thanks, finish conversation" and not d.done
    (e,) = done.step([c.episode_id], ["Anything else?"])
    assert e.terminated and e.reward == 0.0
    assert done._episodes[c.episode_id].chat[-2:] == [{"role": "user", "content": "Anything else?"},
                                                      {"role": "assistant", "content": "Thanks, finish conversation"}]


def test_the_dialogue_is_cut_at_upstreams_forty_messages():
    suite = _suite()
    item = _item(suite, "agent_multi_step_1")
    assert item.max_turns == 20
    score, results = _play(suite, item, ["[login_device()]"] * 25)
    assert len(results) == 20 and results[-1].truncated and not any(r.truncated for r in results[:-1])
    assert score.value == 0.0 and len(score.details["executed"]) == 20


def test_multi_turn_needs_a_simulated_user_and_unknown_items_fail_to_start():
    pool = agent.AgentPool(_suite().references, None)
    (turn, unknown) = pool.start([EpisodeSpec(program="agent_multi_turn_0"), EpisodeSpec(program="nope")])
    assert turn.truncated and "simulated user" in turn.error
    assert unknown.truncated and "no ACEBench agent item" in unknown.error


def test_end_state_and_process_rules_as_upstream():
    answer = [{"BaseApi": {"wifi": True, "logged_in": True}}, {"ReminderAPI": {"reminder_list": {}}}]
    scenario = Scenario(["BaseApi", "ReminderApi"], {"BaseApi": {"wifi": True}})
    scenario.run([{"delete_reminder": {"reminder_id": 1}}])
    # an answer class named as no API class is not checked; the count of classes is
    diff, unchecked = agent.end_state_diff(answer, scenario.state())
    assert diff == [] and unchecked == ["ReminderAPI"]
    assert agent.end_state_diff(answer[:1], scenario.state())[0][0].startswith("wrong number of classes")
    # dict attributes are compared on the answer's keys only: an extra message is not noticed
    messages = Scenario(["MessageApi"], {"BaseApi": {"wifi": True}})
    messages.run([{"delete_message": {"message_id": 3}}, {"send_message": {
        "sender_name": "Eve", "receiver_name": "Frank", "message": "hi"}}])
    inbox = messages.state()[0]["MessageApi"]["inbox"]
    assert set(inbox) == {"1", "2", "4", "5", "6", "7"}
    expected = {k: v for k, v in inbox.items() if k != "7"}
    assert agent.end_state_diff([{"MessageApi": {"inbox": expected}}], messages.state()) == ([], [])
    assert agent.end_state_diff([{"MessageApi": {"inbox": dict(expected, **{"3": {}})}}], messages.state())[0]
    # process: milestones in order (stripped), the best alternative; none means 1
    assert agent.process_accuracy(["[a()]", "[b()]", "[c()]"], ["[a()] ", "[x()]", "[c()]", "[b()]"]) == 2 / 3
    assert agent.process_accuracy([["[a()]", "[b()]"], ["[b()]"]], ["[b()]"]) == 1.0
    assert agent.process_accuracy([], ["[a()]"]) == 1.0


def test_the_apis_keep_upstreams_behaviour():
    phone = Scenario(["BaseApi", "MessageApi", "FoodPlatform"], {"BaseApi": {"wifi": False, "logged_in": True}})
    assert phone.state() == []  # no instance before the first executed reply
    results = phone.run([{"login_food_platform": {"username": "Eve", "password": "password123"}},
                         {"turn_on_wifi": {}},  # reaches every phone class
                         {"login_food_platform": {"username": "Eve", "password": "password123"}},
                         {"delete_message": {"message_id": 1}},
                         {"send_message": {"sender_name": "Eve", "receiver_name": "Jack", "message": "x"}},
                         {"get_latest_message_id": {}},  # a sent message has no time
                         {"check_balance": {"user_name": "Eve"}},
                         {"search_reminders": {"keyword": "x"}}])
    assert results[0]["message"] == "Wi-Fi is not enabled, unable to login" and results[2]["status"] is True
    assert results[5] == "Error during execution: 'time'" and results[6] == 500.0
    assert results[7].startswith("Error during execution: no API named 'search_reminders'")
    assert phone.instances["FoodPlatform"].wifi and phone.instances["MessageApi"].wifi
    travel = Scenario(["Travel"], {})
    booked = travel.run([{"reserve_flight": {"user_id": "user3", "password": "password789", "flight_no": "CZ4352",
                                             "cabin": "Economy Class", "payment_method": "bank", "baggage_count": 4}},
                         {"reserve_flight": {"user_id": "user3", "password": "wrong", "flight_no": "CZ4352",
                                             "cabin": "Economy Class", "payment_method": "bank", "baggage_count": 1}},
                         {"cancel_reservation": {"user_id": "user1", "reservation_id": "res_1", "reason": "other"}}])
    assert booked[0] == "Booking successful. Reservation ID: res_5. Total cost: 1650 yuan (including baggage fees)."
    assert booked[1].startswith("Error during execution") and "More than 24 hours" in booked[2]
    (state,) = travel.state()
    assert state["Travel"]["users"]["user3"]["bank_balance"] == 5000.0 - 1650
    assert state["Travel"]["users"]["user1"]["cash_balance"] == 2000.0 + 1200
    assert [r["reservation_id"] for r in state["Travel"]["reservations"]] == ["res_1", "res_2", "res_3", "res_4", "res_5"]


def test_same_seed_same_items_spread_across_the_categories():
    suite = _suite()
    picked = suite.items(2, seed=3)
    assert [i.item_id for i in picked] == [i.item_id for i in suite.items(2, seed=3)]
    assert {i.group for i in picked} == {"agent_multi_step", "agent_multi_turn"}
    assert len({tuple(i.item_id for i in suite.items(2, seed=s)) for s in range(8)}) > 1
    assert len(suite.items(0, 0)) == len(suite.items(10, 5)) == 4


def test_missing_data_is_a_one_line_unavailable(tmp_path):
    for argument, config in [("", _Config()), (str(tmp_path / "nowhere"), _Config()),
                             ("", _Config(acebench_dir=str(tmp_path))), (str(tmp_path), _Config())]:
        with pytest.raises(SuiteUnavailable) as err:
            agent.make(argument, GenerationSettings(), config)
        message = str(err.value)
        assert "\n" not in message and "github.com/chenchen0103/ACEBench" in message and "acebench-agent:" in message


def test_the_registry_finds_the_suite_with_its_notes():
    assert "acebench-agent" in registered()
    suite = make_suite("acebench-agent", None, _Config(acebench_dir=str(FIXTURE)))
    assert suite.name == "acebench-agent" and suite.settings.temperature == 0.0 and len(suite.items(0, 0)) == 4
    assert any("not comparable to published numbers" in note for note in suite.notes)


def test_a_tiny_policy_plays_every_item_end_to_end(small_tokenizer, tmp_path):
    import jax

    from spade_jax.agent import AgentConfig
    from spade_jax.evals import runner
    from spade_jax.models import ModelConfig, make_mesh, random_policy

    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    cfg = runner.EvalConfig(suites=f"acebench-agent:{FIXTURE}", seed=5)
    # a budget that lets the multi_step episodes (prompts of about 3100 tokens here) play a few turns and
    # ends the multi_turn ones (4500+) after the simulated user's opening line: prompts stay in one bucket
    agent_cfg = AgentConfig(context_budget=3400)
    generation = {"acebench-agent": GenerationSettings(max_new_tokens=8)}
    first = runner.run_suites(policy, None, cfg, agent_cfg, tmp_path / "a", generation, progress=False)
    again = runner.run_suites(policy, None, cfg, agent_cfg, tmp_path / "b", generation, progress=False)
    summary = first[0].summary
    assert summary["items"] == 4 and set(summary["groups"]) == {"agent_multi_step", "agent_multi_turn"}
    assert 0.0 <= summary["score"] <= 1.0 and again[0].summary["score"] == summary["score"]
    assert any("not comparable" in note for note in summary["notes"])
    assert (tmp_path / "a" / "acebench-agent.jsonl").read_text() == (tmp_path / "b" / "acebench-agent.jsonl").read_text()
    rows = {json.loads(line)["item_id"]: json.loads(line)
            for line in (tmp_path / "a" / "acebench-agent.jsonl").read_text().splitlines()}
    assert len(rows) == 4 and all(0.0 <= r["score"] <= 1.0 and 0.0 <= r["details"]["process_accuracy"] <= 1.0
                                  for r in rows.values())
    assert rows["agent_multi_step_0"]["details"]["turns"] >= 1
    opening = rows["agent_multi_turn_0"]["output"][1]["content"]
    assert agent.BASE_PROMPT_EN in opening and "Conversation history 1..t:\nuser:" in opening
    assert (tmp_path / "a" / "acebench-agent.md").exists() and (tmp_path / "a" / "acebench-agent.json").exists()


# A child process, its address space capped at 1 GiB, steps replies on a multi_step item and
# reports each step's seconds and observation: a reply that builds a huge value fails the
# test (a MemoryError inside the call, or the timeout) instead of filling the machine.
_HOSTILE_CHILD = r"""
import json, resource, sys, time, types
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, resource.RLIM_INFINITY))
from spade_jax.evals.suite import GenerationSettings
from spade_jax.evals.suites import acebench_agent as agent
from spade_jax.sandbox.records import EpisodeSpec
suite = agent.make(sys.argv[1], GenerationSettings(), types.SimpleNamespace(limit=0, seed=0, acebench_dir=""))
pool = agent.AgentPool(suite.references, None)
(start,) = pool.start([EpisodeSpec(program="agent_multi_step_1")])
for reply in json.loads(sys.argv[2]):
    began = time.perf_counter()
    (result,) = pool.step([start.episode_id], [reply])
    print(json.dumps({"s": time.perf_counter() - began, "observation": result.observation[:300]}), flush=True)
"""


def test_a_short_reply_that_builds_a_huge_literal_runs_nothing():
    import subprocess
    import sys

    replies = ["[login_device(), view_reminder_by_title(title=[[[0]*10000]*10000]*10)]", "[login_device()]"]
    try:
        done = subprocess.run([sys.executable, "-c", _HOSTILE_CHILD, str(FIXTURE), json.dumps(replies)],
                              capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the reply did not return in 60 s; reported so far: {err.stdout}")
    assert done.returncode == 0, done.stderr[-2000:]
    hostile, fine = [json.loads(line) for line in done.stdout.splitlines()]
    assert hostile["s"] < 5 and hostile["observation"] == f"execution result:{agent.NUDGE}", hostile
    assert fine["observation"] == "execution result:[{'status': True, 'message': 'Device has been logged in'}]"


def test_the_score_judges_what_the_pool_executed_not_a_cut_of_it():
    """The pool reads whole replies; the score replays those, not the agent's parsed action (cut at
    512 characters): milestones padded past the cut execute nothing in play and score 0, and a
    correct reply longer than the cut executes whole in play and scores 1, as the pool rewarded."""
    suite = _suite()
    item = _item(suite, "agent_multi_step_1")
    login, reminder, finish = agent.reference_replies(item.reference)
    padded = [login + " " * 600 + "(done)", reminder + " " * 600 + "(done)", finish]
    score, results = _play(suite, item, padded)
    assert results[-1].terminated and results[-1].reward == 0.0
    assert [r.observation for r in results[:2]] == [f"execution result:{agent.NUDGE}"] * 2
    assert score.value == 0.0 and not score.solved and score.details["executed"] == padded[:2]
    long = [login[:-1] + ", " + " " * 600 + reminder[1:], finish]
    score, results = _play(suite, item, long)
    assert results[-1].terminated and results[-1].reward == 1.0
    assert score.value == 1.0 and score.solved and score.details["executed"] == long[:1]


def test_an_item_past_its_work_budget_ends_failed_with_the_reason():
    from spade_jax.evals import bounded

    suite = dataclasses.replace(_suite(), work_s=0.0)
    item = _item(suite, "agent_multi_step_1")
    pool = suite.episode_pool(types.SimpleNamespace(policy=None, seed=0))
    (start,) = pool.start([EpisodeSpec(program=item.program)])
    (first,) = pool.step([start.episode_id], ["[login_device()]"])
    assert first.truncated and first.error.startswith(bounded.BUDGET_EXCEEDED)
    trajectory = types.SimpleNamespace(messages=[{"role": "assistant", "content": "[login_device()]"}], turns=1,
                                       end_reason="error", error=first.error)
    score = suite.score(item, trajectory)
    assert score.value == 0.0 and score.details["error"] == first.error


def test_the_simulated_users_replies_fit_the_model(monkeypatch):
    """The user's chat grows with the episode: its reply budget is clamped to the room the model has
    left, and a chat with no room ends the episode with the reason instead of raising in the engine."""
    from spade_jax.sampling import chat

    asked = []

    def complete(policy, chats, *, max_new_tokens, limits=None, **kwargs):
        asked.append((max_new_tokens, list(limits) if limits is not None else None))
        return [types.SimpleNamespace(text="finish conversation") for _ in chats]

    monkeypatch.setattr(chat, "complete_chats", complete)
    tokenizer = types.SimpleNamespace(apply_chat_template=lambda messages, **_: [0] * sum(len(m["content"]) for m in messages))
    policy = types.SimpleNamespace(tokenizer=tokenizer, config=types.SimpleNamespace(max_position_embeddings=1000))
    monkeypatch.setattr(agent, "prompt_text", lambda tokenizer, text: text)
    user = agent.PolicyUser(policy, 512, 0)
    lines = user([[{"role": "user", "content": "x" * 300}], [{"role": "user", "content": "x" * 700}],
                  [{"role": "user", "content": "x" * 1000}]])
    assert asked == [(512, [512, 300])] and lines == ["finish conversation", "finish conversation", None]
    suite = _suite()
    item = _item(suite, "agent_multi_turn_0")
    pool = agent.AgentPool(suite.references, lambda chats: [None for _ in chats])
    (start,) = pool.start([EpisodeSpec(program=item.program)])
    assert not start.ok and "no longer fits the model" in start.error
