"""Designer prompts: skill, difficulty, reference document, memory exemplars, the contract.

The same renderer serves self-play and the tiny preset's bootstrap data, so the
bootstrapped model is trained on exactly the prompts it later answers.

Exemplar code was written by the designer model and is replayed into every later prompt,
so it is shown as data: cleaned (`spade_jax.text.clean_text`: valid Unicode, no control
characters) and with every common chat-format special-token spelling broken
(`models.tokenizer.escape_chat_markers`; these prompts are rendered without the
policy's tokenizer), so a remembered program cannot end the user turn it sits in. The
reference document comes from the user's corpus (trusted) and is shown as it is.

Exemplars follow the reference's `_augment_prompt_with_memory` (spade/core/orchestrator.py:
1204-1227, env_memory.py:125-151): after the whole request, a tagged block of positives, each
headed by its skill, win rate and regret and shown with its code, then one line per negative
naming it and why it failed, without code; the prose is ours. Exemplar code is cut as the
reference stores it, to its first characters (2000 by default, env_memory.py:60).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.designer.memory import EnvironmentMemory, Exemplar
from spade_jax.models.tokenizer import escape_chat_markers
from spade_jax.text import clean_text

DIFFICULTIES = ("easy", "medium", "hard")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """How much a designer prompt shows: the self-play designer and the bootstrap's data both use it.

    doc_max_words: words of the reference document kept (the corpus truncates to it).
    exemplars_positive / exemplars_negative: memory exemplars per prompt
    (`EnvironmentMemory.exemplars`; the reference's 2 and 1, orchestrator.py:1213,1224).
    exemplar_max_chars: how much of each exemplar's code is shown: its first characters (the
    reference's 2000).
    """

    doc_max_words: int = 6000
    exemplars_positive: int = 2
    exemplars_negative: int = 1
    exemplar_max_chars: int = 2000

    def __post_init__(self):
        if self.doc_max_words < 1:
            raise ValueError(f"doc_max_words must be >= 1, got {self.doc_max_words}")
        for name in ("exemplars_positive", "exemplars_negative", "exemplar_max_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

DESIGNER_SYSTEM_PROMPT = """You design training environments for a reasoning agent. An environment is one Python program defining exactly one class whose name ends in Env:
- __init__(self, max_turns=..., **kwargs)
- reset(self, seed=None) -> (observation: str, info: dict); the same seed gives the same instance
- step(self, action: str) -> (observation, reward, terminated, truncated, info); reward in [-1, 1], SUCCESS_REWARD (1.0) on a win; truncated when max_turns runs out
- solution(self) -> str: the actions that win the instance of the last reset, one per line
Games take one action per turn as \\boxed{...} (read it with extract_boxed(action)). Tool-use environments subclass ToolUseEnv: declare `tools` (OpenAI function schemas), set self.expected_answer in reset, write tool_<name> methods; the agent calls <tool_call>{"name": ..., "arguments": {...}}</tool_call> and finishes with <answer>...</answer>.
Import only the standard library (math, random, re, json, itertools, collections, heapq, string, fractions, dataclasses, typing, functools) and numpy; `from spade_jax.envs import ToolUseEnv, extract_boxed, SUCCESS_REWARD`. Put difficulty knobs in UPPERCASE constants at the top; optionally declare DIFFICULTY_LEVELS = ("easy", "medium", "hard") in the class and accept __init__(..., difficulty=None) that sets the knobs per level."""


def _number(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value:.2f}"


def _reference_exemplars(exemplars: Sequence[Exemplar]) -> list[str]:
    """The reference layout's parts: the positives' tagged block, then the negatives' lines."""
    positives = [e for e in exemplars if e.kind == "positive"]
    negatives = [e for e in exemplars if e.kind == "negative"]
    parts = []
    if positives:
        blocks = "\n\n".join(
            f"### Example {i} (skill: {e.skill}, win_rate: {_number(e.win_rate)}, regret: {_number(e.regret)})\n"
            f"```python\n{exemplar_code(e.code)}\n```" for i, e in enumerate(positives, 1))
        parts.append("<EXAMPLE_ENVIRONMENTS>\nEarlier environments whose difficulty suited the agent. Borrow "
                     "their structure and level of complexity, but design a different game:\n\n"
                     f"{blocks}\n</EXAMPLE_ENVIRONMENTS>")
    if negatives:
        parts.append("Do not design environments like these:\n" + "\n".join(
            f"- {e.label} (win_rate={_number(e.win_rate)}): environment {e.env_id}" for e in negatives))
    return parts


def exemplar_code(code: str) -> str:
    """Model-written code as it may appear in a prompt (see the module docstring)."""
    return escape_chat_markers(clean_text(code))


def designer_user_prompt(skill: str, difficulty: str, reference: str, exemplars: Sequence[Exemplar]) -> str:
    """The user turn of a designer prompt; `reference` is a wrapped document (`Document.as_reference`),
    or empty for a prompt without one; the exemplars follow the request (module docstring)."""
    parts = [f"Skill: {skill}\nDifficulty: {difficulty}"]
    if reference:
        parts.append(f"Ground the environment in this reference document where it fits:\n{reference}")
    parts.append(
        f"Write a new {difficulty} environment that trains {skill}. Reply with one complete program "
        "in a single ```python code block."
    )
    return "\n\n".join(parts + _reference_exemplars(exemplars))


def designer_messages(
    skill: str, difficulty: str, reference: str, exemplars: Sequence[Exemplar],
    system_prompt: str = DESIGNER_SYSTEM_PROMPT,
) -> list[dict]:
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": designer_user_prompt(skill, difficulty, reference, exemplars)},
    ]


def slot_exemplars(memory: EnvironmentMemory | None, rng: np.random.Generator, prompt: PromptConfig,
                   skill: str | None = None) -> list[Exemplar]:
    """The exemplars one designer slot of ``skill`` shows: drawn from ``memory`` (none when it
    is None; ``skill`` None draws over every skill), their code cut to the prompt's size."""
    drawn = memory.exemplars(rng, n_positive=prompt.exemplars_positive, n_negative=prompt.exemplars_negative,
                             skill=skill) if memory is not None else []
    return [dataclasses.replace(e, code=e.code[: prompt.exemplar_max_chars]) for e in drawn]


def slot_messages(memory: EnvironmentMemory | None, rng: np.random.Generator, skill: str, difficulty: str, doc,
                  prompt: PromptConfig) -> list[dict]:
    """The chat messages of one designer slot: `slot_exemplars` and ``doc`` (a `Document`,
    already cut by the corpus). ``memory`` None gives no exemplars and ``doc`` None no
    document (the no-memory and no-corpus ablations)."""
    exemplars = slot_exemplars(memory, rng, prompt, skill)
    return designer_messages(skill, difficulty, doc.as_reference() if doc is not None else "", exemplars)


def designer_answer(code: str) -> str:
    """How a designer reply presents its program (bootstrap targets use the same form)."""
    return f"```python\n{code.strip()}\n```"
