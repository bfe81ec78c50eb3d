"""Attack: one fixed answer wins every seed.

"Is the number composite?" asked only of composite numbers: \\boxed{yes} without reading
anything wins every play, while random play almost never says "yes" alone, so the old
admission's random probes saw a hard game. What catches it: the blind stage, whose fixed
answers include the first move of another seed's solution.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

COMPOSITES = tuple(n for n in range(10, 100) if any(n % d == 0 for d in range(2, 10)))


class FixedAnswerEnv:
    """Say whether a number is composite."""

    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.number = random.Random(seed).choice(COMPOSITES)
        return f"Is {self.number} composite? Answer \\boxed{{yes}} or \\boxed{{no}}.", {}

    def step(self, action):
        if extract_boxed(action) == "yes":
            return "Right.", SUCCESS_REWARD, True, False, {}
        return "Wrong.", 0.0, True, False, {}

    def solution(self):
        return "\\boxed{yes}"
