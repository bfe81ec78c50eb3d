"""Letter count: count how often a letter appears in a row of letters.

Skill: pattern recognition. Kind: game (one answer). Testbed family: one knob, LENGTH.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

LENGTH = 8  # allowed: 3..48, letters in the row, each one of p, q, r, s
LEVELS = {"easy": 4, "medium": 10, "hard": 24}


class LetterCountEnv:
    """How many times does the asked letter appear in the row?"""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global LENGTH
        if difficulty is not None:
            LENGTH = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        letters = [rng.choice("pqrs") for _ in range(LENGTH)]
        target = rng.choice("pqrs")
        self.answer = letters.count(target)
        self.turn, self.done = 0, False
        observation = (
            f"How many times does {target} appear in: {' '.join(letters)}\n"
            "Reply with the count in \\boxed{}, e.g. \\boxed{2}."
        )
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
        return self._result("Wrong count.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
