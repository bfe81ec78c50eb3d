"""A well-behaved game that prints at import and on every call (its output must never reach stdout)."""

import random

from spade_jax.envs import extract_boxed

print("NO" + "ISE at import")


class NoisyEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        print("NO" + "ISE in reset")
        self.n = random.Random(seed).randint(1, 3)
        self.turn = 0
        return "Guess 1, 2 or 3 as \\boxed{n}.", {}

    def step(self, action):
        print("NO" + "ISE in step")
        self.turn += 1
        won = extract_boxed(action) == str(self.n)
        return ("yes" if won else "no"), float(won), won, not won and self.turn >= self.max_turns, {}

    def solution(self):  # a play: guess 1, 2, 3 in turn until "yes"
        return "\n".join("\\boxed{%d}" % guess for guess in range(1, self.n + 1))
