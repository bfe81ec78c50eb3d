"""Failure: solution() does not solve the instance it describes."""

import random


class InfeasibleEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 9)
        self.turn = 0
        return "Guess my digit as \\boxed{d}.", {}

    def step(self, action):
        self.turn += 1
        won = extract_boxed(action) == str(self.secret)
        truncated = not won and self.turn >= self.max_turns
        return ("yes" if won else "no"), (SUCCESS_REWARD if won else 0.0), won, truncated, {}

    def solution(self):
        return "\\boxed{" + str(self.secret % 9 + 1) + "}"
