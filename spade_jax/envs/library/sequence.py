"""Sequence: find the rule behind a number sequence and give the next term.

Skill: pattern recognition. Kind: game (one answer).
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

SHOWN_TERMS = 5  # allowed: 4..8, terms shown before the missing one
NUM_KINDS = 2  # allowed: 1..4, rule kinds in play: arithmetic, geometric, growing steps, Fibonacci-like
LEVELS = {"easy": (6, 1), "medium": (5, 2), "hard": (4, 4)}

KINDS = ["arithmetic", "geometric", "growing", "fibonacci"]


class SequenceEnv:
    """Continue a sequence such as 3, 7, 11, 15, ... with its next term."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global SHOWN_TERMS, NUM_KINDS
        if difficulty is not None:
            SHOWN_TERMS, NUM_KINDS = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        kinds = KINDS[:NUM_KINDS]
        while True:
            kind = rng.choice(kinds)
            if kind == "geometric":
                first = rng.randint(1, 5)
                second = first * rng.randint(2, 3)
            elif kind == "fibonacci":
                first, second = rng.randint(1, 9), rng.randint(1, 9)
            else:
                first = rng.randint(1, 20)
                second = first + rng.randint(1, 9)
            shown = self._extend(kind, first, second, SHOWN_TERMS)
            answers = {self._extend(k, first, second, SHOWN_TERMS + 1)[-1] for k in kinds
                       if self._extend(k, first, second, SHOWN_TERMS) == shown}
            if len(answers) == 1:
                break
        self.answer = answers.pop()
        self.turn, self.done = 0, False
        observation = (
            f"What number comes next? {', '.join(map(str, shown))}, ?\n"
            "Reply with the next term in \\boxed{}, e.g. \\boxed{42}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"-?\d+", text):
            return self._result("Invalid action. Reply with an integer in \\boxed{}, e.g. \\boxed{42}.")
        if int(text) == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong answer.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

    def _extend(self, kind, first, second, length):
        """The first `length` terms of rule `kind` starting with `first, second` (None if it cannot)."""
        if kind == "geometric" and second % first != 0:
            return None
        terms = [first, second]
        while len(terms) < length:
            a, b = terms[-2], terms[-1]
            if kind == "arithmetic":
                terms.append(b + (b - a))
            elif kind == "geometric":
                terms.append(b * (second // first))
            elif kind == "growing":
                terms.append(b + (b - a) + 1)
            else:
                terms.append(a + b)
        return terms

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
