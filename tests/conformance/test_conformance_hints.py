"""Hint mode `self` follows the reference (spade-rl/spade core/hint_generator.py and
orchestrator.py), one test per rule; mode `strategy` exists (issue 32)."""

from __future__ import annotations

import types

from spade_jax.agent import hints
from spade_jax.agent.hints import HintConfig, clean_hint, matched_requests

TOOL_ENV = "from spade_jax.envs import ToolUseEnv\n\n\nclass ShopEnv(ToolUseEnv):\n    pass\n"
GAME_ENV = "class GuessEnv:\n    pass\n"


def _fake_sampler(monkeypatch, replies_by_attempt):
    """complete_chats answering the k-th call with replies_by_attempt[k] (one per chat); records the chats."""
    calls = []

    def fake(policy, chats, **kwargs):
        calls.append((list(chats), kwargs))
        return [types.SimpleNamespace(text=t) for t in replies_by_attempt[len(calls) - 1][: len(chats)]]

    monkeypatch.setattr(hints, "complete_chats", fake)
    monkeypatch.setattr(hints, "prompt_text", lambda tokenizer, text: text)
    return calls


def test_the_game_prompt_carries_the_reference_rules_and_examples():
    """hint_generator.py:24-45: 1-3 sentences under 100 words, strategy + answer format, the
    player answers in \\boxed{}, never the exact answer, a good and a bad example; ~1400 chars."""
    prompt = hints.REFERENCE_HINT_SYSTEM_PROMPT
    assert len(prompt) == 1415  # the reference's text, character for character
    for rule in ("Keep it to 1-3 sentences (under 100 words)", "\\boxed{answer}", "Do NOT reveal the exact answer",
                 "expected answer format", "GOOD hint example:", "BAD hint example:",
                 "Output ONLY the hint text. No JSON, no markdown, no labels."):
        assert rule in prompt, rule
    rewritten = hints.HINT_SYSTEM_PROMPT
    assert 1100 <= len(rewritten) <= 1800
    for rule in ("1 to 3 sentences", "fewer than 100 words", "\\boxed{answer}", "Never give the exact answer",
                 "answer format", "GOOD:", "BAD:", "no JSON, no markdown"):
        assert rule in rewritten, rule


def test_the_hint_prompts_are_the_references_words_by_default():
    """The reference's two system prompts verbatim by default; spade_jax's rewording is the option
    `hints.prompt_wording="rewritten"`."""
    assert HintConfig().prompt_wording == "reference"
    assert hints.system_prompt(GAME_ENV) == hints.REFERENCE_HINT_SYSTEM_PROMPT
    assert hints.system_prompt(GAME_ENV, "tool_use") == hints.REFERENCE_TOOL_USE_HINT_SYSTEM_PROMPT
    assert hints.REFERENCE_TOOL_USE_HINT_SYSTEM_PROMPT.startswith(
        "You are analyzing a MULTI-TURN tool-use environment's source code")
    assert hints.system_prompt(GAME_ENV, "cognitive", "rewritten") == hints.HINT_SYSTEM_PROMPT
    assert hints.system_prompt(GAME_ENV, "tool_use", "rewritten") == hints.TOOL_USE_HINT_SYSTEM_PROMPT


def test_the_tool_use_prompt_is_chosen_by_game_type_as_the_reference_keys_it():
    """hint_generator.py:78-82 and types.py:208: game_type 'tool_use' picks the tool-use prompt,
    anything else (default 'cognitive') the game prompt; 'auto' (a deviation) picks per program."""
    tool = hints.REFERENCE_TOOL_USE_HINT_SYSTEM_PROMPT
    for rule in ("<answer>done</answer>", "placeholders", "NEVER write concrete data values", "2-3 sentences",
                 "GOOD hint", "BAD hint"):
        assert rule in tool, rule
    assert HintConfig().game_type == "cognitive"
    assert hints.system_prompt(TOOL_ENV) == hints.REFERENCE_HINT_SYSTEM_PROMPT
    assert hints.system_prompt(GAME_ENV, "tool_use") == tool
    assert hints.system_prompt(TOOL_ENV, "auto") == tool
    assert hints.system_prompt(GAME_ENV, "auto") == hints.REFERENCE_HINT_SYSTEM_PROMPT


def test_the_user_message_is_the_reference_framing_of_the_whole_program(monkeypatch):
    """hint_generator.py:154 and 246: system prompt, then 'Environment code:' and the fenced code."""
    calls = _fake_sampler(monkeypatch, [["Halve the range each turn."] * 2])
    code = GAME_ENV + "#" * 7000  # longer than the old 6000-character cut
    hints.write_hints(types.SimpleNamespace(tokenizer=None), [code], HintConfig())
    (chat,), _ = calls[0]
    assert chat == [{"role": "system", "content": hints.REFERENCE_HINT_SYSTEM_PROMPT},
                    {"role": "user", "content": f"Environment code:\n```python\n{code}\n```"}]


def test_sampling_defaults_are_the_references(monkeypatch):
    """types.py:154 temperature 0.3; max_new_tokens 4096 (issue 32); the reply is kept whole."""
    cfg = HintConfig()
    assert (cfg.temperature, cfg.max_new_tokens, cfg.retries) == (0.3, 4096, 2)
    calls = _fake_sampler(monkeypatch, [["x"]])
    hints.write_hints(types.SimpleNamespace(tokenizer=None), [GAME_ENV], cfg)
    assert calls[0][1]["temperature"] == 0.3 and calls[0][1]["max_new_tokens"] == 4096


def test_the_hint_is_kept_whole_and_a_fenced_json_hint_unwrapped():
    """hint_generator.py:132-149: strip, take "hint" out of a ```json block, no sentence cut."""
    reply = "  First sort the items.\nThen add the two smallest. Then repeat. Answer with one integer.  "
    assert clean_hint(reply) == reply.strip()
    assert clean_hint('```json\n{"hint": "Use binary search."}\n```') == "Use binary search."
    assert clean_hint('```json\n{"note": 1}\n```') == '```json\n{"note": 1}\n```'
    assert clean_hint("") is None


def test_a_whitespace_hint_is_the_empty_hint_and_is_played(monkeypatch):
    """hint_generator.py:217-226: only an empty reply raises (and is sampled again); one of
    whitespace alone is stripped to "" and played, injected as an empty "HINT: " (the hint
    injection template is "{observation}\\n\\nHINT: {hint}")."""
    assert clean_hint(" \n ") == ""
    calls = _fake_sampler(monkeypatch, [["  \n "]])
    assert hints.write_hints(types.SimpleNamespace(tokenizer=None), [GAME_ENV], HintConfig()) == [""]
    assert len(calls) == 1
    hinted = [r for r in matched_requests(0, GAME_ENV, [7], "self", hint="", hinted_seeds=[9]) if r.hinted]
    assert [(r.seed, r.hint) for r in hinted] == [(9, "")]


def test_an_empty_hint_is_sampled_again_three_attempts_in_all(monkeypatch):
    """hint_generator.py:268-287: max_retries=3 attempts; an empty reply is a failed attempt."""
    calls = _fake_sampler(monkeypatch, [["", "Count the walls."], [""], ["Go by parity."]])
    out = hints.write_hints(types.SimpleNamespace(tokenizer=None), [GAME_ENV, TOOL_ENV], HintConfig())
    assert out == ["Go by parity.", "Count the walls."]
    assert [len(chats) for chats, _ in calls] == [2, 1, 1]
    assert len({kwargs["seed"] for _, kwargs in calls}) == 3  # each attempt samples afresh
    calls = _fake_sampler(monkeypatch, [[""], [""], [""], ["never asked"]])
    assert hints.write_hints(types.SimpleNamespace(tokenizer=None), [GAME_ENV], HintConfig()) == [None]
    assert len(calls) == 3


def test_an_environment_without_a_hint_gets_no_hinted_plays():
    """orchestrator.py:1939-1944: a failed hint gives the game no hinted plays (regret 0)."""
    for mode in ("self", "strategy", "placebo"):
        requests = matched_requests(0, GAME_ENV, [7, 8], mode, hint=None)
        assert [(r.seed, r.hinted) for r in requests] == [(7, False), (8, False)]
    hinted = [r for r in matched_requests(0, GAME_ENV, [7], "self", hint="Halve the range.") if r.hinted]
    assert [(r.seed, r.hint) for r in hinted] == [(7, "Halve the range.")]


def test_mode_strategy_writes_offline_hints_and_none_for_unknown_programs():
    from spade_jax.envs import library

    assert "strategy" in hints.HINT_MODES
    out = hints.write_hints(None, [library.load_source("number_guess"), GAME_ENV], HintConfig(mode="strategy"))
    assert out[0].startswith("Use binary search") and out[1] is None
    placebo = hints.write_hints(None, [library.load_source("number_guess")],
                                HintConfig(mode="placebo", placebo_of="strategy"))
    assert len(placebo[0]) == len(out[0]) and "binary" not in placebo[0]
    requests = matched_requests(0, "code", [3], "strategy", hint=out[0])
    assert [(r.hinted, r.hint, r.hint_from_solution) for r in requests] == [(False, None, False), (True, out[0], False)]


def test_a_program_whose_hint_prompt_fills_the_context_gets_no_hint(monkeypatch, small_tokenizer):
    """A designed program may be any length: one whose prompt leaves no room to reply is not sent
    (its environment then has no hinted plays, as one whose hint failed); the others reply
    within the room their prompt leaves."""
    calls = _fake_sampler(monkeypatch, [["Halve the range each turn."]])
    short = len(small_tokenizer.apply_chat_template(hints.hint_chat(GAME_ENV, HintConfig(), small_tokenizer),
                                                    add_generation_prompt=True))
    policy = types.SimpleNamespace(tokenizer=small_tokenizer, config=types.SimpleNamespace(max_position_embeddings=short + 50))
    out = hints.write_hints(policy, [GAME_ENV, GAME_ENV + "#" * 20000], HintConfig())
    assert out == ["Halve the range each turn.", None]
    (chats, kwargs), = calls
    assert len(chats) == 1 and kwargs["limits"] == [50]

