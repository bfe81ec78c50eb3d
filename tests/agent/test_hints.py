"""Hint modes decide which episodes measure an environment's regret (agent/hints.py)."""

import types

import pytest

from spade_jax.agent import matched_requests
from spade_jax.agent.hints import clean_hint


def _first_observation(trajectory) -> str:
    return next(m["content"] for m in trajectory.messages if m["role"] == "user")


def test_each_hint_mode_gives_matched_plain_and_hinted_requests():
    plain_only = matched_requests(3, "code", [7, 8], "none", hint="ignored")
    assert [(r.env_key, r.seed, r.hinted) for r in plain_only] == [(3, 7, False), (3, 8, False)]

    own = matched_requests(0, "code", [7, 8], "self", hint="Try 4.")
    assert [(r.seed, r.hinted, r.hint, r.hint_from_solution) for r in own] == [
        (7, False, None, False), (8, False, None, False), (7, True, "Try 4.", False), (8, True, "Try 4.", False)]

    solution = matched_requests(0, "code", [7], "solution", hint="ignored")
    assert [(r.hinted, r.hint, r.hint_from_solution) for r in solution] == [(False, None, False), (True, None, True)]

    placebo = matched_requests(0, "code", [7], "placebo", hint="Read the task again.")
    assert [(r.hinted, r.hint, r.hint_from_solution) for r in placebo] == [
        (False, None, False), (True, "Read the task again.", False)]

    resample = matched_requests(0, "code", [7, 8], "resample", hint="ignored")
    assert [(r.seed, r.hinted, r.hint, r.hint_from_solution, r.placebo) for r in resample] == [
        (7, False, None, False, False), (8, False, None, False, False),
        (7, True, None, False, False), (8, True, None, False, False)]

    with pytest.raises(ValueError, match="hint mode"):
        matched_requests(0, "code", [7], "psychic")


def test_placebo_hints_have_the_length_of_the_hint_they_replace_and_no_content(monkeypatch, small_tokenizer):
    from spade_jax.agent import hints

    written = ["Add the two numbers shown, then answer as \\boxed{sum}.", "Go left twice.", None]
    by_code = dict(zip(["code a", "code b", "code c"], written))

    def fake_complete(policy, chats, **kwargs):
        assert chats[0][1]["content"].startswith("Environment code:\n```python\n")  # the same call as mode self
        return [types.SimpleNamespace(text=by_code[chat[1]["content"].split("\n")[2]] or "") for chat in chats]

    monkeypatch.setattr(hints, "complete_chats", fake_complete)
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    out = hints.write_hints(policy, ["code a", "code b", "code c"], hints.HintConfig(mode="placebo"))
    assert [len(h) for h in out[:2]] == [len(written[0]), len(written[1])] and out[2] is None
    assert out[0].startswith("Read the task again") and "boxed" not in out[0] and "left" not in out[1]
    assert hints.placebo_hint(300) == hints.placebo_hint(300) and len(hints.placebo_hint(300)) == 300


def test_clean_hint_keeps_the_reply_whole():
    assert clean_hint("HINT: Add them.\nThen box it! Extra one. Too many.\n") == (
        "HINT: Add them.\nThen box it! Extra one. Too many.")
    assert clean_hint("  \n ") == "" and clean_hint("") is None


def test_a_placebo_of_solution_hints_has_the_solution_hints_length_and_none_of_its_content(small_tokenizer,
                                                                                          canned_sampler):
    from spade_jax.agent import AgentConfig, play_episodes
    from spade_jax.agent.rollout import HINT_SEPARATOR, solution_hint
    from spade_jax.envs import library
    from spade_jax.sandbox import EpisodeSpec, SandboxConfig, SandboxPool

    program = library.load_source("tallest")
    sample = canned_sampler(small_tokenizer.encode("\\boxed{1}"))

    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        real = matched_requests(0, program, [5], "solution")
        fake = matched_requests(0, program, [5], "placebo", placebo_of="solution")
        (_, informed), (_, placebo) = (play_episodes(policy, pool, r, AgentConfig(max_turns=1, context_budget=4096),
                                                     sample=sample) for r in (real, fake))
        (start,) = pool.start([EpisodeSpec(program=program, seed=5)])
        (solution,) = pool.solution([start.episode_id])
    hint = solution_hint(solution)
    informed_first, placebo_first = (_first_observation(t) for t in (informed, placebo))
    informed_hint = informed_first.split(HINT_SEPARATOR)[1]
    placebo_hint = placebo_first.split(HINT_SEPARATOR)[1]
    assert hint in informed_first and len(placebo_hint) == len(informed_hint)
    assert placebo_hint.startswith("Read the task again") and hint not in placebo_first


def test_a_resampled_hinted_play_reads_exactly_what_its_plain_twin_reads(small_tokenizer, canned_sampler):
    from spade_jax.agent import AgentConfig, play_episodes
    from spade_jax.agent.rollout import HINT_SEPARATOR
    from spade_jax.envs import library
    from spade_jax.sandbox import SandboxConfig, SandboxPool

    policy = types.SimpleNamespace(tokenizer=small_tokenizer)
    with SandboxPool(SandboxConfig(num_workers=1)) as pool:
        plain, hinted = play_episodes(policy, pool, matched_requests(0, library.load_source("tallest"), [5], "resample"),
                                      AgentConfig(max_turns=1, context_budget=4096),
                                      sample=canned_sampler(small_tokenizer.encode("\\boxed{1}")))
    assert (plain.hinted, hinted.hinted) == (False, True)
    assert hinted.messages[:2] == plain.messages[:2] and HINT_SEPARATOR not in _first_observation(hinted)


def test_a_solution_hint_is_the_whole_plan_numbered_one_action_per_turn():
    from spade_jax.agent.rollout import SOLUTION_HINT_PREFIX, solution_hint

    assert solution_hint("<tool_call>{}</tool_call>\n\n  <answer>7</answer> \n") == (
        SOLUTION_HINT_PREFIX + "1) <tool_call>{}</tool_call> 2) <answer>7</answer>")
    assert solution_hint("\\boxed{3}") == SOLUTION_HINT_PREFIX + "1) \\boxed{3}"
    assert solution_hint(" \n ") is None and solution_hint(None) is None
