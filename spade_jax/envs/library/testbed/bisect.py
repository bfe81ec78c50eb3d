"""Bisect: find a hidden number; every wrong guess is answered with the range still possible.

Skill: logical deduction. Kind: game (multi-turn). Testbed family: one knob, RANGE.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

RANGE = 16  # allowed: 6..512, the secret is a whole number from 1 to RANGE
LEVELS = {"easy": 8, "medium": 32, "hard": 128}


class BisectEnv:
    """Guess the secret in RANGE.bit_length() + 1 guesses; halving the range left always wins.
    The last wrong guess ends the game, lost."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=12, difficulty=None, **kwargs):
        global RANGE
        if difficulty is not None:
            RANGE = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, RANGE)
        self.low, self.high = 1, RANGE
        self.guesses = RANGE.bit_length() + 1
        self.turn, self.done = 0, False
        observation = (
            f"Find the secret number from 1 to {RANGE} in {self.guesses} guesses. "
            "Reply with one guess per turn in \\boxed{}, e.g. \\boxed{5}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"\d+", text):
            return self._result(f"Invalid guess. It is from {self.low} to {self.high}.")
        guess = int(text)
        if guess == self.secret:
            return self._result("Correct!", SUCCESS_REWARD, True)
        if self.turn >= self.guesses:
            return self._result(f"{guess} is wrong. Out of guesses.", 0.0, True)
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            return self._result(f"{guess} is too low. It is from {self.low} to {self.high}.")
        self.high = min(self.high, guess - 1)
        return self._result(f"{guess} is too high. It is from {self.low} to {self.high}.")

    def solution(self):
        low, high, actions = 1, RANGE, []
        while True:
            guess = (low + high) // 2
            actions.append(f"\\boxed{{{guess}}}")
            if guess == self.secret:
                return "\n".join(actions)
            if guess < self.secret:
                low = guess + 1
            else:
                high = guess - 1

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
