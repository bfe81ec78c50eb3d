"""The actions admission plays: random probes and the blind stage's fixed answers.

``random_actions`` draws plays that look like an agent's: plausible actions in the program's
own format (``\\boxed{..}`` guesses, sometimes inside model-like text; tool calls to the tools
the env declares, malformed calls and ``<answer>``s for ``ToolUseEnv``s), no-ops
(``NOOP_ACTIONS``) and garbage (random printable text, empty, ~4000 characters, unicode).

``fixed_answers`` and ``blind_script`` build the blind stage's strategies: one well-formed
answer, the same on every seed, taken from what the program itself shows (the winning move
of another seed's solution, an example in its first observation), a small int, and a random
plausible answer; ``answer_key`` says when two actions give the same answer.

Pure functions of an ``random.Random`` and their arguments; standard library only.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Sequence

from spade_jax.envs.contract import extract_boxed
from spade_jax.envs.tool_use import normalize_answer, tool_call_action

NOOP_ACTIONS = ("", "\\boxed{}", "pass", "<answer></answer>", "<tool_call></tool_call>")

_WORDS = ("yes", "no", "left", "right", "up", "down", "north", "south", "east", "west", "red", "blue",
          "green", "apple", "stone", "river", "alpha", "beta", "true", "false", "none", "start", "stop",
          "open", "close", "swap", "wait", "skip", "submit", "A", "B", "C", "D", "x", "y", "z", "AB", "BA")
_KEYS = ("item", "name", "city", "person", "a", "b", "x", "n", "query", "id", "index", "from", "to",
         "factor", "value", "level", "amount")
_TEMPLATES = ("I think the answer is {}.", "Let me try {}", "My move: {}", "Answer: {}",
              "After thinking it through, {} is my choice.", "Okay.\n\n{}",
              "Step 1: look at the options.\nStep 2: pick the best one.\nSo: {}")
_UNICODE = ((0xA1, 0xFF), (0x300, 0x36F), (0x391, 0x3C9), (0x410, 0x44F), (0x627, 0x64A),
            (0x2000, 0x206F), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F))
_MALFORMED_CALLS = ("<tool_call>not json</tool_call>", '<tool_call>{"name": </tool_call>',
                    '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
                    '<tool_call>{"name": "%s", "arguments": [1, 2]}</tool_call>', "<tool_call>[]</tool_call>",
                    '<tool_call>{"name": "%s", "arguments": {', "<tool_call>null</tool_call>")
_BOXED_EXAMPLE = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_RANDOM_TRIES = 8  # draws for a random answer distinct from the others


def random_actions(rng: random.Random, n: int, *, tool_use: bool, tools: Sequence[str] = (),
                   plausible_only: bool = False) -> list[str]:
    """``n`` random actions for a program of the given kind (``tools``: the names it declares).

    Mixes plausible actions in the program's own format (``\\boxed{..}`` with a small int, a
    word or a comma list, sometimes inside model-like text; for tool-use programs tool calls
    to its tools with random arguments, malformed calls and ``<answer>``s), no-ops and
    garbage (random printable text, empty, ~4000 characters, unicode, the other kind's
    format). ``plausible_only`` leaves out the garbage and no-ops.
    """
    return [_random_action(rng, tool_use, list(tools), plausible_only) for _ in range(n)]


def answer_key(action: str, tool_use: bool) -> str | None:
    """The answer ``action`` gives, normalised so that equal answers compare equal (case,
    spacing, trailing dots, ``2`` vs ``2.0``): its ``\\boxed{}`` content (a game) or
    ``<answer>`` content (a tool-use program), else the whole action; None when that is empty."""
    found = _ANSWER.search(action) if tool_use else None
    text = found.group(1) if found else (None if tool_use else extract_boxed(action))
    text = normalize_answer(action if text is None else text)
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        return text
    return repr(number) if math.isfinite(number) else text


def solution_answer(lines: Sequence[str]) -> str | None:
    """The line of a solution that carries its final answer: its last line (None: no lines)."""
    return lines[-1] if lines else None


def fixed_answers(rng: random.Random, *, tool_use: bool, moves: Sequence[str], observation: str,
                  count: int) -> list[str]:
    """Up to ``count`` answer actions with distinct ``answer_key``s, in the program's own format.

    In order: ``moves`` (the caller gives the winning moves of solutions it replayed, the
    level's own first: well-formed by construction, and the first is the strongest blind
    candidate), the examples the first ``observation`` shows (``\\boxed{..}`` or
    ``<answer>..``), the answer 1. The last place goes to a random plausible answer (a small
    int, a word or a list; a game's sometimes inside model-like text) when one distinct from
    the others is drawn.
    """
    pattern = _ANSWER if tool_use else _BOXED_EXAMPLE
    found = [*moves, *(_as_answer(text, tool_use) for text in pattern.findall(observation)), _as_answer("1", tool_use)]
    answers, keys = [], set()
    for action in found:
        key = answer_key(action, tool_use)
        if key is not None and key not in keys and len(answers) < count - 1:
            answers.append(action)
            keys.add(key)
    for _ in range(_RANDOM_TRIES):
        action = _as_answer(_value(rng), tool_use)
        if not tool_use and rng.random() < 0.35:
            action = rng.choice(_TEMPLATES).format(action)
        if answer_key(action, tool_use) not in keys:
            answers.append(action)
            break
    return answers[:count]


def blind_script(answer: str, *, tool_use: bool, tools: Sequence[str], turns: int) -> list[str]:
    """The blind play of ``answer`` over ``turns`` turns: a game repeats it every turn; a
    tool-use program first calls its first declared tool with no arguments, then answers."""
    if tool_use and tools:
        return [tool_call_action(tools[0], {})] + [answer] * max(1, turns - 1)
    return [answer] * turns


def _as_answer(text: str, tool_use: bool) -> str:
    return f"<answer>{text}</answer>" if tool_use else "\\boxed{%s}" % text


def _random_action(rng: random.Random, tool_use: bool, tools: list[str], plausible_only: bool) -> str:
    roll = 0.0 if plausible_only else rng.random()
    if roll < 0.6:
        action = _tool_action(rng, tools) if tool_use else "\\boxed{%s}" % _value(rng)
        return rng.choice(_TEMPLATES).format(action) if rng.random() < 0.35 else action
    if roll < 0.72:
        return rng.choice(NOOP_ACTIONS)
    if roll < 0.82:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 80)))
    if roll < 0.87:
        return _long_text(rng)
    if roll < 0.94:
        text = _unicode_text(rng, rng.randint(1, 40))
        return "\\boxed{%s}" % text if rng.random() < 0.5 else text
    return "\\boxed{%s}" % _value(rng) if tool_use else _tool_action(rng, tools)


def _value(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return str(_int(rng))
    if roll < 0.85:
        return rng.choice(_WORDS)
    parts = [str(_int(rng)) if rng.random() < 0.6 else rng.choice(_WORDS) for _ in range(rng.randint(2, 5))]
    return rng.choice((",", ", ", " ")).join(parts)


def _int(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.25:
        return rng.randint(0, 9)
    if roll < 0.6:
        return rng.randint(10, 99)
    if roll < 0.85:
        return rng.randint(100, 9999)
    return -rng.randint(1, 99)


def _tool_action(rng: random.Random, tools: list[str]) -> str:
    roll = rng.random()
    name = rng.choice(tools) if tools else rng.choice(_WORDS)
    if roll < 0.55:
        if rng.random() < 0.1:
            name = rng.choice(_WORDS)  # a tool the env does not declare
        arguments = {rng.choice(_KEYS): _argument(rng) for _ in range(rng.randint(0, 3))}
        return tool_call_action(name, arguments)
    if roll < 0.7:
        malformed = rng.choice(_MALFORMED_CALLS)
        return malformed % name if "%s" in malformed else malformed
    return "<answer>%s</answer>" % _value(rng)


def _argument(rng: random.Random):
    roll = rng.random()
    if roll < 0.4:
        return _int(rng)
    if roll < 0.75:
        return rng.choice(_WORDS)
    if roll < 0.85:
        return round(rng.uniform(-100, 100), 2)
    if roll < 0.9:
        return rng.random() < 0.5
    return [_int(rng) for _ in range(rng.randint(0, 3))]


def _long_text(rng: random.Random) -> str:
    size = rng.randint(3500, 4500)
    kind = rng.randrange(3)
    if kind == 0:  # at most 4000 digits: Python's int() refuses more than 4300
        return "\\boxed{" + "".join(rng.choice(string.digits) for _ in range(size - 500)) + "}"
    if kind == 1:
        return "".join(rng.choice(string.ascii_letters + " ") for _ in range(size))
    return "".join(rng.choice(string.printable) for _ in range(size))


def _unicode_text(rng: random.Random, size: int) -> str:
    chars = []
    for _ in range(size):
        low, high = rng.choice(_UNICODE)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


__all__ = ["NOOP_ACTIONS", "answer_key", "blind_script", "fixed_answers", "random_actions", "solution_answer"]
