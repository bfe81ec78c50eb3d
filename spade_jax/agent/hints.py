"""Privileged hints: how regret is measured.

Modes:
  self      the policy reads the environment's source and writes a 1-3 sentence hint
            (strategy and answer format, never the exact answer); one batched sampler
            call for all environments. The reference behaviour.
  solution  each hinted episode is told the whole plan of the environment's own
            `solution()` for its seed, one numbered action per turn (see
            `rollout.solution_hint`). A deliberate deviation for tests and the tiny
            preset, whose bootstrap model cannot write hints: the hint carries everything
            the solution knows, so regret measures how much of it the agent can use.
  placebo   the noise floor of regret: the hints of mode `placebo_of` (`self`: written
            by the same sampler call; `solution`: taken from `solution()`) each replaced by
            neutral advice of the same length (`rollout.placebo_hint`), so hinted plays differ
            from plain ones only by a prompt of the same size that carries no information.
  resample  the estimator's own noise floor: each hinted play is a second plain play on the
            same seed (no hint text, its own sampling randomness), so regret measures only
            the noise of comparing K plays with K plays. Unlike `placebo` it changes nothing
            the agent reads, which matters for a policy that a strange hint disturbs.
  none      no hints: hinted plays equal plain plays and regret is 0.

The environment source the policy reads in mode `self` is designer-written, so it enters
the hint prompt through `conversation.prompt_text` (clean Unicode, the tokenizer's special
tokens escaped). Hints themselves are cleaned here and escaped again where they enter the
agent's first observation (`Conversation.start`); `solution` hints are cleaned and bounded
by `rollout.solution_hint`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from spade_jax.agent.conversation import prompt_text
from spade_jax.agent.rollout import EpisodeRequest, placebo_hint
from spade_jax.sampling.chat import complete_chats
from spade_jax.sandbox.text import clean_text

HINT_MODES = ("self", "solution", "placebo", "resample", "none")

HINT_SYSTEM_PROMPT = "You write short hints for players of text environments."
HINT_INSTRUCTIONS = (
    "Below is the source code of an environment an agent will play. Write a hint of 1 to 3 sentences "
    "for the agent: the strategy that works and the exact format its actions must have. Never state "
    "the answer itself. Reply with the hint only.\n\n```python\n{code}\n```"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclasses.dataclass(frozen=True)
class HintConfig:
    """How hints are had (`mode`, and for mode `placebo` the mode whose hints it imitates,
    `placebo_of`: see the module docstring) and, when written by the policy, sampled:
    the source shown is cut to `max_code_chars`, the reply to `max_sentences` sentences."""

    mode: str = "self"
    placebo_of: str = "self"
    max_new_tokens: int = 96
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    max_code_chars: int = 6000
    max_sentences: int = 3

    def __post_init__(self):
        if self.mode not in HINT_MODES:
            raise ValueError(f"hint mode {self.mode!r} is unknown; choose one of {HINT_MODES}")
        if self.placebo_of not in ("self", "solution"):
            raise ValueError(f"hints.placebo_of must be 'self' or 'solution', got {self.placebo_of!r}")


def clean_hint(text: str, max_sentences: int = 3) -> str | None:
    """The first `max_sentences` sentences of the reply on one line, or None if empty."""
    text = " ".join(clean_text(text).replace("HINT:", " ").split())
    if not text:
        return None
    return " ".join(_SENTENCE_END.split(text)[:max_sentences])


def write_hints(policy, programs: Sequence[str], cfg: HintConfig, *, seed: int = 0) -> list[str | None]:
    """One self-written hint per program (mode `self`), or its placebo of the same length (mode
    `placebo` of `self`); None for other modes."""
    if not (cfg.mode == "self" or (cfg.mode, cfg.placebo_of) == ("placebo", "self")) or not programs:
        return [None] * len(programs)
    chats = [
        [
            {"role": "system", "content": HINT_SYSTEM_PROMPT},
            {"role": "user", "content": HINT_INSTRUCTIONS.format(
                code=prompt_text(policy.tokenizer, code[: cfg.max_code_chars]))},
        ]
        for code in programs
    ]
    completions = complete_chats(policy, chats, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                 top_p=cfg.top_p, top_k=cfg.top_k, seed=seed)
    hints = [clean_hint(c.text, cfg.max_sentences) for c in completions]
    if cfg.mode == "placebo":
        return [placebo_hint(len(h)) if h else None for h in hints]
    return hints


def matched_requests(env_key: int, program: str, seeds: Sequence[int], mode: str,
                     hint: str | None = None, placebo_of: str = "self") -> list[EpisodeRequest]:
    """The episodes that measure one environment's regret: one plain play per seed, then,
    unless ``mode`` is "none", one hinted play on each of the same seeds.

    Modes "self" and "placebo" (of "self") show ``hint`` (`write_hints`); mode "solution" has
    the rollout take the plan of the environment's `solution()` for the seed, and
    "placebo" of "solution" a placebo of that hint's length; mode "resample" shows nothing.
    """
    if mode not in HINT_MODES:
        raise ValueError(f"hint mode {mode!r} is unknown; choose one of {HINT_MODES}")
    requests = [EpisodeRequest(env_key=env_key, program=program, seed=s) for s in seeds]
    if mode != "none":
        requests += [
            EpisodeRequest(env_key=env_key, program=program, seed=s, hinted=True,
                           hint=hint if mode in ("self", "placebo") else None,
                           hint_from_solution=mode == "solution" or (mode, placebo_of) == ("placebo", "solution"),
                           placebo=(mode, placebo_of) == ("placebo", "solution"))
            for s in seeds
        ]
    return requests
