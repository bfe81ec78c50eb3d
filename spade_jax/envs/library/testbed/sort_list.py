"""Sort list: write a list of numbers from smallest to largest.

Skill: optimization. Kind: game (one answer). Testbed family: one knob, LENGTH.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

LENGTH = 4  # allowed: 2..16, numbers in the list, each from 1 to 99
LEVELS = {"easy": 3, "medium": 6, "hard": 10}


class SortListEnv:
    """Sort the numbers in increasing order; repeated numbers are written as often as they appear."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global LENGTH
        if difficulty is not None:
            LENGTH = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        numbers = [rng.randint(1, 99) for _ in range(LENGTH)]
        self.answer = sorted(numbers)
        self.turn, self.done = 0, False
        observation = (
            f"Sort these numbers from smallest to largest: {' '.join(map(str, numbers))}\n"
            "Reply with them in \\boxed{}, separated by spaces, e.g. \\boxed{3 8 20}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"\d+( \d+)*", text.strip()):
            return self._result("Invalid action. Reply with numbers separated by spaces in \\boxed{}.")
        if [int(n) for n in text.split()] == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong order.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{' '.join(map(str, self.answer))}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
