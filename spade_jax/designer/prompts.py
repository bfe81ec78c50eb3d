"""Designer prompts: skill, difficulty, reference document, memory exemplars, the contract.

The same renderer serves self-play and the tiny preset's bootstrap data, so the
bootstrapped model is trained on exactly the prompts it later answers.

Exemplar code was written by the designer model and is replayed into every later prompt,
so it is shown as data: cleaned (`sandbox.text.clean_text`: valid Unicode, no control
characters) and with every common chat-format special-token spelling broken
(`models.tokenizer.escape_chat_markers`; these prompts are rendered without the
policy's tokenizer), so a remembered program cannot end the user turn it sits in. The
reference document comes from the user's corpus (trusted) and is shown as it is.
"""

from __future__ import annotations

from typing import Sequence

from spade_jax.designer.memory import Exemplar
from spade_jax.models.tokenizer import escape_chat_markers
from spade_jax.sandbox.text import clean_text

DIFFICULTIES = ("easy", "medium", "hard")

DESIGNER_SYSTEM_PROMPT = """You design training environments for a reasoning agent. An environment is one Python program defining exactly one class whose name ends in Env:
- __init__(self, max_turns=..., **kwargs)
- reset(self, seed=None) -> (observation: str, info: dict); the same seed gives the same instance
- step(self, action: str) -> (observation, reward, terminated, truncated, info); reward in [-1, 1], SUCCESS_REWARD (1.0) on a win; truncated when max_turns runs out
- solution(self) -> str: the actions that win the instance of the last reset, one per line
Games take one action per turn as \\boxed{...} (read it with extract_boxed(action)). Tool-use environments subclass ToolUseEnv: declare `tools` (OpenAI function schemas), set self.expected_answer in reset, write tool_<name> methods; the agent calls <tool_call>{"name": ..., "arguments": {...}}</tool_call> and finishes with <answer>...</answer>.
Import only the standard library (math, random, re, json, itertools, collections, heapq, string, fractions, dataclasses, typing, functools) and numpy; `from spade_jax.envs import ToolUseEnv, extract_boxed, SUCCESS_REWARD`. Put difficulty knobs in UPPERCASE constants at the top."""


def _exemplar_block(number: int, exemplar: Exemplar) -> str:
    facts = [exemplar.label]
    if exemplar.win_rate is not None:
        facts.append(f"win rate {exemplar.win_rate:.2f}")
    if exemplar.regret is not None:
        facts.append(f"regret {exemplar.regret:.2f}")
    verdict = "avoid environments like this" if exemplar.kind == "negative" else "a good example"
    return (f"Example {number} ({exemplar.skill}; {', '.join(facts)}; {verdict}):\n"
            f"```python\n{exemplar_code(exemplar.code)}\n```")


def exemplar_code(code: str) -> str:
    """Model-written code as it may appear in a prompt (see the module docstring)."""
    return escape_chat_markers(clean_text(code))


def designer_user_prompt(skill: str, difficulty: str, reference: str, exemplars: Sequence[Exemplar]) -> str:
    """The user turn of a designer prompt; `reference` is a wrapped document (`Document.as_reference`)."""
    parts = [
        f"Skill: {skill}\nDifficulty: {difficulty}",
        f"Ground the environment in this reference document where it fits:\n{reference}",
    ]
    if exemplars:
        parts.append(
            "Environments designed before and how the agent did on them:\n\n"
            + "\n\n".join(_exemplar_block(i + 1, e) for i, e in enumerate(exemplars))
        )
    parts.append(
        f"Write a new {difficulty} environment that trains {skill}. Reply with one complete program "
        "in a single ```python code block."
    )
    return "\n\n".join(parts)


def designer_messages(
    skill: str, difficulty: str, reference: str, exemplars: Sequence[Exemplar], system_prompt: str = DESIGNER_SYSTEM_PROMPT
) -> list[dict]:
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": designer_user_prompt(skill, difficulty, reference, exemplars)},
    ]


def designer_answer(code: str) -> str:
    """How a designer reply presents its program (bootstrap targets use the same form)."""
    return f"```python\n{code.strip()}\n```"
