"""Procedure memory with preplay (agent/procedures.py): abstraction, counts, preplay, loop and evaluation."""

import json
import types

import pytest

from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.agent.procedures import (
    PROCEDURES_FILE,
    ProcedureConfig,
    ProcedureMemory,
    Step,
    abstract,
    action_kind,
    family_of,
    procedure_path,
    skill_of,
)
from spade_jax.agent.rollout import GUIDANCE_SEPARATOR, HINT_SEPARATOR
from spade_jax.envs import library
from spade_jax.sandbox import SandboxConfig, SandboxPool


def _messages(*turns):
    """system, the first observation, then (reply, observation) pairs; a final reply without one."""
    out = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for turn in turns:
        reply, observation = turn if isinstance(turn, tuple) else (turn, None)
        out.append({"role": "assistant", "content": reply})
        if observation is not None:
            out.append({"role": "user", "content": observation})
    return out


def _call(name, **arguments):
    return "I will look it up. <tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _won(memory, key, *kinds):
    steps = [Step(kind, "progress") for kind in kinds[:-1]] + [Step(kinds[-1], "win")]
    return memory.update(key, steps, True)


def _lost(memory, key, *kinds):
    steps = [Step(kind, "progress") for kind in kinds[:-1]] + [Step(kinds[-1], "loss")]
    return memory.update(key, steps, False)


# ---- abstraction ------------------------------------------------------------------------------


def test_a_tool_use_trajectory_becomes_its_kinds_and_stages_with_rejected_steps_dropped():
    messages = _messages(
        (_call("price", item="apple"), "One apple costs 3 coins."),
        (_call("price", item="kiwi"), "Unknown item 'kiwi'."),
        ("<tool_call>{not json</tool_call>", "Error: malformed tool call (...)."),
        (_call("price", item="pear"), "One pear costs 2 coins."),
        "The total is <answer>7</answer>",
    )
    steps = abstract(messages, won=True, end_reason="terminated")
    assert steps == (Step("call:price", "progress"), Step("call:price", "error"), Step("call:?", "error"),
                     Step("call:price", "progress"), Step("answer", "win"))
    assert procedure_path(steps) == (("call:price", 2), ("answer", 1))
    lost = abstract(messages, won=False, end_reason="terminated")
    assert lost[-1] == Step("answer", "loss")
    assert abstract(messages[:-1], won=False, end_reason="max_turns")[-1] == Step("call:price", "progress")
    assert abstract(messages, won=False, end_reason="truncated")[-1] == Step("answer", "cut")


@pytest.mark.parametrize("reply, kind", [
    ("so \\boxed{42}", "boxed:number"), ("\\boxed{-3/4}", "boxed:number"), ("\\boxed{2 + 3*4}", "boxed:expression"),
    ("\\boxed{A B C}", "boxed:list"), ("\\boxed{3,4}", "boxed:list"), ("\\boxed{left}", "boxed:word"),
    ("\\boxed{}", "boxed:empty"), ("\\boxed{?!}", "boxed:text"), ("I am not sure.", "invalid"),
    ('<tool_call>{"name": "a b", "arguments": {}}</tool_call>', "call:?"), ("<answer>x</answer> \\boxed{1}", "answer"),
])
def test_action_kinds(reply, kind):
    assert action_kind(reply) == kind


def test_a_boxed_game_trajectory_keeps_invalid_moves_out_of_its_procedure():
    messages = _messages(("\\boxed{50}", "50 is too high."), ("\\boxed{fifty}", "Invalid action. Reply with a number."),
                         ("\\boxed{25}", "25 is too low."), "\\boxed{37}")
    steps = abstract(messages, won=True, end_reason="terminated")
    assert [s.stage for s in steps] == ["progress", "error", "progress", "win"]
    assert procedure_path(steps) == (("boxed:number", 3),)


def test_keys_are_read_with_ast_from_the_program():
    shopping = library.load_source("shopping")
    assert family_of(shopping) == "ShoppingEnv"
    assert skill_of(shopping) == "mathematical reasoning" and skill_of(library.load_source("tallest")) == (
        "logical deduction")
    assert family_of("class Broken(:") is None and skill_of('"""Skill: juggling."""\nclass XEnv: pass') is None
    memory = ProcedureMemory(ProcedureConfig(key="family"))
    assert memory.key(shopping, skill="optimization") == "ShoppingEnv"
    assert ProcedureMemory().key(shopping, skill="optimization") == "optimization"
    assert ProcedureMemory().key(shopping) == "mathematical reasoning"


# ---- counts -------------------------------------------------------------------------------------


def test_counts_update_as_specified():
    memory = ProcedureMemory(ProcedureConfig(prior_success=2.0, prior_failure=3.0))
    # won: START->call:price->answer->END, each transition success 1 / count 1 (the repeat counts once)
    assert _won(memory, "math", "call:price", "call:price", "answer") == 3
    assert memory.transition("math", "START", "call:price") == (1, 1)
    assert memory.transition("math", "call:price", "answer") == (1, 1)
    assert memory.transition("math", "answer", "END") == (1, 1)
    assert memory.transition("math", "call:price", "call:price") is None  # a run is one node
    # lost on the same path: count 2, success 1 on each
    assert _lost(memory, "math", "call:price", "answer") == 3
    assert memory.transition("math", "answer", "END") == (1, 2)
    assert memory.reliability(1, 2) == pytest.approx((1 + 2) / (2 + 2 + 3))
    # lost on a new path: only the transitions the graph holds are counted, none is added
    assert _lost(memory, "math", "answer") == 1
    assert memory.transition("math", "START", "answer") is None and memory.transition("math", "answer", "END") == (1, 3)
    # a lost episode of a key without a graph adds nothing
    assert _lost(memory, "logic", "answer") == 0 and memory.keys() == ["math"]
    # a cycle: every distinct transition once
    assert _won(memory, "math", "call:a", "call:b", "call:a", "answer") == 5
    assert memory.transition("math", "call:a", "answer") == (1, 1) and memory.transition("math", "answer", "END") == (2, 4)
    assert memory.num_transitions == 7


# ---- preplay ------------------------------------------------------------------------------------


def test_the_most_reliable_path_wins_over_a_more_frequent_less_reliable_one():
    memory = ProcedureMemory()
    _won(memory, "k", "call:a", "answer")
    for _ in range(3):
        _won(memory, "k", "call:b", "answer")
    for _ in range(7):
        _lost(memory, "k", "call:b", "answer")
    # a: 2/3 * 2/3 * 5/13 = 20/117;  b (3 wins of 10): 4/12 * 4/12 * 5/13 = 5/117
    preplay = memory.preplay("k")
    assert [kind for kind, _ in preplay.steps] == ["call:a", "answer"]
    assert preplay.reliability == pytest.approx(20 / 117)
    assert memory.guidance("k") == "A procedure that won before (reliability 0.17): 1. call a  2. answer"
    assert memory.guidance("other") is None and memory.guidance(None) is None


def test_preplay_text_is_deterministic_for_a_graph_and_survives_a_state_round_trip():
    cfg = ProcedureConfig()
    one, two = ProcedureMemory(cfg), ProcedureMemory(cfg)
    plays = [("call:b", "answer"), ("call:a", "answer"), ("call:price", "call:price", "call:price", "answer")]
    for kinds in plays:
        _won(one, "k", *kinds)
    for kinds in reversed(plays):
        _won(two, "k", *kinds)
    # 2/3 * 2/3 * 4/5 each; equal reliabilities: the shorter path, then the smaller kinds
    assert one.guidance("k") == two.guidance("k") == (
        "A procedure that won before (reliability 0.36): 1. call a  2. answer")
    _won(one, "k", "call:price", "call:price", "call:price", "answer")
    _won(one, "k", "call:price", "answer")
    # price: 4/5 * 4/5 * 6/7 = 0.549; its typical run is the rounded mean of 3, 3 and 1
    text = one.guidance("k")
    assert text == "A procedure that won before (reliability 0.55): 1. call price (x2)  2. answer"
    restored = ProcedureMemory.from_state(cfg, json.loads(json.dumps(one.to_state())))
    assert restored.to_state() == one.to_state() and restored.guidance("k") == text
    assert restored.summary() == one.summary()


def test_preplay_is_bounded_in_steps_and_characters():
    kinds = [f"call:tool_{i}_{'x' * 30}" for i in range(8)] + ["answer"]
    long_path = ProcedureMemory(ProcedureConfig(max_steps=6))
    _won(long_path, "k", *kinds)
    assert long_path.preplay("k") is None  # 9 nodes do not fit 6 steps
    short_text = ProcedureMemory(ProcedureConfig(max_steps=9, max_chars=120))
    _won(short_text, "k", *kinds)
    text = short_text.guidance("k")
    assert len(text) <= 120 and text.endswith(" ...") and "1. call tool_0_" in text
    wide = ProcedureMemory(ProcedureConfig(max_steps=9, max_chars=1000))
    _won(wide, "k", *kinds)
    assert wide.guidance("k").endswith("9. answer")
    few = ProcedureMemory(ProcedureConfig(min_count=2))
    _won(few, "k", "answer")
    assert few.guidance("k") is None
    _lost(few, "k", "answer")
    assert few.guidance("k") == "A procedure that won before (reliability 0.25): 1. answer"


def test_config_rejects_bad_values():
    for bad in (dict(key="env"), dict(prior_failure=0.0), dict(max_steps=0), dict(max_chars=10)):
        with pytest.raises(ValueError):
            ProcedureConfig(**bad)


# ---- episodes, evaluation, loop, gallery --------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=1)) as p:
        yield p


def test_guidance_follows_the_first_observation_of_plain_and_hinted_plays(pool, small_tokenizer, canned_sampler):
    program = library.load_source("shopping")
    sample = canned_sampler(small_tokenizer.encode("<answer>1</answer>"))
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    guidance = "A procedure that won before (reliability 0.50): 1. call price  2. answer"
    requests = [EpisodeRequest(0, program, 3, guidance=guidance),
                EpisodeRequest(0, program, 3, hinted=True, hint="Add the prices.", guidance=guidance),
                EpisodeRequest(0, program, 3)]
    plain, hinted, unguided = play_episodes(policy, pool, requests, AgentConfig(max_turns=1, context_budget=4096),
                                            sample=sample)
    first = unguided.messages[1]["content"]
    assert plain.messages[1]["content"] == first + GUIDANCE_SEPARATOR + guidance
    assert hinted.messages[1]["content"] == first + GUIDANCE_SEPARATOR + guidance + HINT_SEPARATOR + "Add the prices."


def test_environment_suites_play_with_guidance_and_benchmarks_without(pool, small_tokenizer, canned_sampler,
                                                                      monkeypatch):
    from spade_jax.evals import runner
    from spade_jax.evals.suite import GenerationSettings, Item
    from spade_jax.evals.suites.envs import EnvironmentSuite
    from spade_jax.sandbox.admission import AdmissionConfig

    sample = canned_sampler(small_tokenizer.encode("<answer>1</answer>"))
    played = []

    def play(*args, **kwargs):
        played.append(args[2])
        return play_episodes(*args, sample=sample, **kwargs)

    monkeypatch.setattr(runner, "play_episodes", play)
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    suite = EnvironmentSuite("envs-x", [], GenerationSettings(max_new_tokens=8), 1, 1, AdmissionConfig())
    items = [Item("shopping/seed3", group="shopping", program=library.load_source("shopping"), seed=3, max_turns=1),
             Item("tallest/seed3", group="tallest", program=library.load_source("tallest"), seed=3, max_turns=1)]
    memory = ProcedureMemory()
    _won(memory, "mathematical reasoning", "call:price", "answer")
    guide = lambda program: memory.guidance(memory.key(program))  # noqa: E731
    cfg = runner.EvalConfig()
    guided = runner.run_suite(policy, pool, suite, cfg, AgentConfig(context_budget=4096), None, progress=False,
                              items=items, guidance=guide)
    assert guided.summary["guided"] == 1  # tallest's skill has no graph
    assert [r.guidance for r in played[0]] == [memory.guidance("mathematical reasoning"), None]
    benchmark = types.SimpleNamespace(name="bench", settings=suite.settings, score=suite.score)
    plain = runner.run_suite(policy, pool, benchmark, cfg, AgentConfig(context_budget=4096), None, progress=False,
                             items=items, guidance=guide)
    assert "guided" not in plain.summary and [r.guidance for r in played[1]] == [None, None]


def _procedures_on(c):
    c.hints.mode = "solution"
    c.agent.procedure_memory.enabled = True


def test_the_loop_learns_from_plain_plays_writes_its_summary_and_checkpoints_it(tmp_path, random_selfplay):
    from spade_jax.selfplay.gallery import _procedures
    from spade_jax.selfplay.state import PoolEnv

    run = random_selfplay(tmp_path, _procedures_on)
    procedures = run.components.named("procedures")
    try:
        env = PoolEnv("seed-shopping", library.load_source("shopping"), "mathematical reasoning", None, 0)
        assert procedures.guidance(env) is None
        won = _messages((_call("price", item="apple"), "One apple costs 3 coins."), "<answer>3</answer>")
        lost = _messages("<answer>9</answer>")

        def play(hinted, messages, won_, guidance=None):
            request = EpisodeRequest(0, env.code, 1, hinted=hinted, guidance=guidance)
            return types.SimpleNamespace(request=request, hinted=hinted, messages=messages, won=won_,
                                         end_reason="terminated", turns=len(messages) // 2)

        metrics = procedures.observe([env], [play(True, won, True), play(False, lost, False)])
        assert metrics["procedures/transitions"] == 0  # the hinted win is not learned from; the loss adds nothing
        metrics = procedures.observe([env], [play(False, won, True), play(False, lost, False, "G"),
                                             play(True, lost, False)])
        assert metrics == {"procedures/keys": 1, "procedures/transitions": 3, "procedures/guided_episodes": 1}
        assert procedures.memory.transition("mathematical reasoning", "answer", "END") == (1, 2)
        text = procedures.guidance(env)
        assert text == "A procedure that won before (reliability 0.22): 1. call price  2. answer"
        assert procedures.heldout_guidance(library.load_source("arithmetic")) == text  # a held-out family of the skill
        summary = json.loads((tmp_path / PROCEDURES_FILE).read_text())
        assert summary["mathematical reasoning"]["preplay"]["text"] == text
        section = _procedures(tmp_path)
        assert "mathematical reasoning" in section and "call price" in section
        assert [section.count(r) for r in ("0.67", "0.50")] == [2, 1]

        meta = json.loads(json.dumps(run.lifecycle.meta()))
        digest = run.lifecycle.state_digest()
        procedures.memory = ProcedureMemory(procedures.cfg)
        assert run.lifecycle.state_digest() != digest
        run.lifecycle.load_meta(meta)
        assert procedures.guidance(env) == text and run.lifecycle.state_digest() == digest
        run.lifecycle.load_meta({k: v for k, v in meta.items() if k != "procedures"})  # a checkpoint from before
        assert procedures.memory.num_transitions == 0
    finally:
        run.close()


def test_a_run_guides_its_plays_counts_them_and_resumes_with_its_procedures(tmp_path, small_tokenizer, canned_sampler,
                                                                           random_selfplay, monkeypatch):
    from spade_jax.envs.library import SKILLS
    from spade_jax.selfplay import loop

    sample = canned_sampler(small_tokenizer.encode("<answer>1</answer>"))
    monkeypatch.setattr(loop, "play_episodes", lambda *a, **k: play_episodes(*a, sample=sample, **k))
    run = random_selfplay(tmp_path, _procedures_on)
    try:
        for skill in SKILLS:
            run.components.named("procedures").memory.update(skill, [Step("answer", "win")], True)
        (metrics,) = run.run(1)
        (env,) = run._replays(0)
        state = run.components.named("procedures").to_state()
    finally:
        run.close()
    assert metrics["agent/episodes"] == 4 and metrics["procedures/guided_episodes"] == 4
    assert metrics["procedures/keys"] == len(SKILLS) and metrics["procedures/transitions"] == 2 * len(SKILLS)
    ((success, count),) = [v for s, d, *v in state[env.skill]["edges"] if (s, d) == ("START", "answer")]
    assert count == 3 and success == 1 + 2 * metrics["agent/plain_win_rate"]  # the two plain plays, not the hinted
    resumed = random_selfplay(tmp_path, _procedures_on)
    try:
        assert resumed.lifecycle.restore() and resumed.components.named("procedures").to_state() == state
    finally:
        resumed.close()
