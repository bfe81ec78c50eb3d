"""The environment contract every generated or handwritten environment follows.

An environment program is a Python module that defines exactly one class whose
name ends in ``Env``:

    class SomethingEnv:
        def __init__(self, max_turns=10, **kwargs): ...
        def reset(self, seed=None) -> tuple[str, dict]: ...
        def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...
        def solution(self) -> str: ...   # optional: reference actions, one per line

* ``reset(seed)`` builds a fresh instance from ``seed`` (same seed, same instance)
  and returns the first observation and an info dict. Seeds are ints drawn uniformly
  from ``range(EPISODE_SEED_SPACE)`` (training and admission alike).
* ``step(action)`` returns ``(observation, reward, terminated, truncated, info)``.
  Rewards lie in [-1, 1]; ``SUCCESS_REWARD`` (1.0) on the final step means the
  episode was won. ``truncated`` is set when ``max_turns`` runs out. A program may
  grade a wrong final answer (partial credit, as the reference's corpus environments
  do); the seed library does so only when made with ``partial_credit=True``, scoring
  ``PARTIAL_CREDIT_SCALE`` times the answer's closeness.
* Optional difficulty knob: the class declares ``DIFFICULTY_LEVELS = ("easy",
  "medium", "hard")`` (a literal tuple of distinct short names, easiest first; read
  by ``spade_jax.sandbox.policy.difficulty_levels`` without running the program) and
  ``__init__`` accepts ``difficulty=<level>`` (None: its default). Admission constructs
  and resets every level; calibration, when on (``spade_jax/related/calibration/``),
  plays the agent at each and picks the level it sometimes solves.
* Reasoning games take one action per turn written as ``\\boxed{...}``; use
  ``extract_boxed(action)`` to read it.
* Tool-use environments subclass ``ToolUseEnv`` (see ``tool_use.py``): the agent
  calls tools with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  and finishes with ``<answer>...</answer>``.
* Imports: standard-library modules useful to environments (math, random, re,
  json, itertools, collections, heapq, string, fractions, dataclasses, typing,
  functools, ...) and numpy. ``ToolUseEnv``, ``extract_boxed`` and
  ``SUCCESS_REWARD`` are predefined names in every environment module.
  The exact list is ``spade_jax.sandbox.policy.ALLOWED_MODULES``; ``open``,
  ``input``, ``__import__`` and introspection escapes are refused too.
* As checked by the sandbox (``spade_jax/sandbox/validate.py``): results are real
  tuples; the observation is a ``str``; the reward an ``int``/``float`` (numpy
  scalars too), finite; the flags ``bool``; ``info`` JSON-serialisable. Each
  episode runs in its own process, so module-level state is per episode.

This module is imported inside sandbox workers: standard library only.
"""

from __future__ import annotations

import math
import re

SUCCESS_REWARD = 1.0
# The most a wrong final answer scores where an environment grades it (the library's
# ``partial_credit=True``): closeness in [0, 1] times this, so no near miss counts as a win.
PARTIAL_CREDIT_SCALE = 0.5
# The reward of an episode one of whose steps ran past its deadline.
DEFAULT_TIMEOUT_PENALTY = -0.5
# Episode seeds are drawn uniformly from range(EPISODE_SEED_SPACE): by the self-play loop for
# training episodes and by sandbox admission for its probes, so a program cannot tell them apart.
EPISODE_SEED_SPACE = 2**31

_BOXED_OPEN = re.compile(r"\\boxed\s*\{")


def extract_boxed(text: str) -> str | None:
    """Returns the content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    if not isinstance(text, str):
        return None
    starts = [m.end() for m in _BOXED_OPEN.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def episode_reward(final_reward: float, terminated: bool, timed_out: bool = False, *,
                   timeout_penalty: float = DEFAULT_TIMEOUT_PENALTY) -> float:
    """The scalar reward of a finished episode.

    final_reward: the reward its last step returned (read only if the episode terminated);
    terminated: whether that step set ``terminated``; timed_out: whether a step ran past its
    deadline (takes precedence: ``timeout_penalty``). A terminated episode gets its last reward
    clipped to [-1, 1]; one that ended any other way (truncated, out of turns or context) 0.
    A terminated episode with a non-finite reward is a sandbox bug (it reports such a step as
    a failure) and raises ValueError.
    """
    if timed_out:
        return float(timeout_penalty)
    if not terminated:
        return 0.0
    if not math.isfinite(final_reward):
        raise ValueError(f"an episode terminated with a non-finite reward {final_reward}; the sandbox must report "
                         "such a step as a failure instead")
    return min(1.0, max(-1.0, float(final_reward)))


def is_success(reward: float) -> bool:
    """An episode is won when its final reward reaches SUCCESS_REWARD."""
    return reward >= SUCCESS_REWARD - 1e-6
