"""Number guess: find a secret number from "too high" / "too low" feedback.

Skill: logical deduction. Kind: game (multi-turn).
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

MAX_NUMBER = 20  # allowed: 4..1000, the secret is between 1 and MAX_NUMBER
LEVELS = {"easy": 10, "medium": 50, "hard": 200}


class NumberGuessEnv:
    """Guess a secret number; each wrong guess is answered with too high or too low."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=12, difficulty=None, **kwargs):
        global MAX_NUMBER
        if difficulty is not None:
            MAX_NUMBER = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, MAX_NUMBER)
        self.turn, self.done = 0, False
        observation = (
            f"I picked a secret whole number from 1 to {MAX_NUMBER}. After each guess I say "
            f"whether it is too high or too low. You have {self.max_turns} guesses.\n"
            "Reply with one guess per turn in \\boxed{}, e.g. \\boxed{7}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"\d+", text) or not 1 <= int(text) <= MAX_NUMBER:
            return self._result(f"Invalid action. Reply with a number from 1 to {MAX_NUMBER} in \\boxed{{}}.")
        guess = int(text)
        if guess == self.secret:
            return self._result(f"Correct! The number is {guess}.", SUCCESS_REWARD, True)
        hint = "too high" if guess > self.secret else "too low"
        return self._result(f"{guess} is {hint}.")

    def solution(self):
        low, high, actions = 1, MAX_NUMBER, []
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
