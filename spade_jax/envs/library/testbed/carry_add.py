"""Carry add: add two numbers one column at a time, ones column first, carrying into the next.

Skill: mathematical reasoning. Kind: game (multi-turn). Testbed family: one knob, DIGITS.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

DIGITS = 3  # allowed: 1..10, digits of each number; a carry out of the last column adds a column
LEVELS = {"easy": 2, "medium": 4, "hard": 7}


class CarryAddEnv:
    """Write the sum's digit of each column, ones first; a column shows its two digits, not the carry."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=12, difficulty=None, **kwargs):
        global DIGITS
        if difficulty is not None:
            DIGITS = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        low = 10 ** (DIGITS - 1) if DIGITS > 1 else 0
        a, b = rng.randint(low, 10**DIGITS - 1), rng.randint(low, 10**DIGITS - 1)
        self.total = a + b
        self.sum_digits = [int(d) for d in reversed(str(self.total))]
        self.columns = [(a // 10**k % 10, b // 10**k % 10) for k in range(len(self.sum_digits))]
        self.column = 0
        self.turn, self.done = 0, False
        observation = (
            f"Add {a} + {b} one column at a time, ones column first. For each column reply with the "
            "digit of the sum in \\boxed{}, carrying into the next column.\n" + self._ask()
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"\d", text):
            return self._result("Invalid action. Reply with one digit in \\boxed{}. " + self._ask())
        if int(text) != self.sum_digits[self.column]:
            return self._result("Wrong digit.", 0.0, True)
        self.column += 1
        if self.column == len(self.sum_digits):
            return self._result(f"Correct! The sum is {self.total}.", SUCCESS_REWARD, True)
        return self._result("Right. " + self._ask())

    def solution(self):
        return "\n".join(f"\\boxed{{{digit}}}" for digit in self.sum_digits)

    def _ask(self):
        top, bottom = self.columns[self.column]
        return f"Column {self.column + 1}: {top} + {bottom}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
