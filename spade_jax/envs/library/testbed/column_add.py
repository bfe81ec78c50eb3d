"""Column add: add two whole numbers, carrying from column to column.

Skill: mathematical reasoning. Kind: game (one answer). Testbed family: one knob, DIGITS.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

DIGITS = 3  # allowed: 1..10, digits of each number
LEVELS = {"easy": 1, "medium": 3, "hard": 6}


class ColumnAddEnv:
    """Compute a + b for two numbers of DIGITS digits each."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global DIGITS
        if difficulty is not None:
            DIGITS = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        low = 10 ** (DIGITS - 1) if DIGITS > 1 else 0
        a, b = rng.randint(low, 10**DIGITS - 1), rng.randint(low, 10**DIGITS - 1)
        self.answer = a + b
        self.turn, self.done = 0, False
        observation = f"Compute {a} + {b}.\nReply with the sum in \\boxed{{}}, e.g. \\boxed{{15}}."
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"\d+", text):
            return self._result("Invalid action. Reply with a whole number in \\boxed{}.")
        if int(text) == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong sum.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
