"""Failure: the instance depends on unseeded randomness (same seed, different observations)."""

import random


class CoinEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.coin = random.choice(["heads", "tails"]) + str(random.random())
        self.turn = 0
        return f"I tossed a coin (serial {self.coin[5:]}). Say \\boxed{{heads}} or \\boxed{{tails}}.", {}

    def step(self, action):
        self.turn += 1
        won = extract_boxed(action) == self.coin[:5]
        done = won or self.turn >= self.max_turns
        return ("right" if won else "wrong"), (1.0 if won else 0.0), won, done and not won, {}

    def solution(self):
        return "\\boxed{" + self.coin[:5] + "}"
