"""Attack: deterministic at its default level, noisy at the level calibration may choose.

Admission used to replay only default-level plays for determinism, so a program could
pass with a "hard" level whose outcome is a coin flip: matched plain and hinted plays of
the same seed then differ by chance, and that noise reads as regret.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class LevelNoiseEnv:
    """Guess the parity of a hidden number."""

    DIFFICULTY_LEVELS = ("easy", "hard")

    def __init__(self, max_turns=4, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.noisy = difficulty == "hard"

    def reset(self, seed=None):
        rng = random.Random() if self.noisy else random.Random(seed)
        self.number = rng.randint(1, 1000)
        self.turn = 0
        return f"A number was drawn (seed {seed}). Is it even or odd? Reply \\boxed{{even}} or \\boxed{{odd}}.", {}

    def step(self, action):
        self.turn += 1
        answer = extract_boxed(action)
        correct = "even" if self.number % 2 == 0 else "odd"
        if answer == correct:
            return "Correct.", SUCCESS_REWARD, True, False, {}
        return f"No (it was {self.number}).", 0.0, True, False, {}

    def solution(self):
        return "\\boxed{%s}" % ("even" if self.number % 2 == 0 else "odd")
