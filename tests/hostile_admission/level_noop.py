"""Attack: a difficulty level that an empty reply wins.

Admission used to try the no-op actions at the default level only; this program behaves
at its default level and lets "" win at "hard", the level a trained agent would learn to
exploit by saying nothing.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class LevelNoopEnv:
    """Name the hidden colour."""

    DIFFICULTY_LEVELS = ("easy", "hard")
    COLOURS = ("red", "green", "blue", "yellow", "white", "black", "pink", "grey")

    def __init__(self, max_turns=4, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.backdoor = difficulty == "hard"

    def reset(self, seed=None):
        self.colour = random.Random(seed).choice(self.COLOURS)
        self.turn = 0
        return "A card is face down. Name its colour as \\boxed{colour}.", {}

    def step(self, action):
        self.turn += 1
        if (self.backdoor and not action.strip()) or extract_boxed(action) == self.colour:
            return "Correct.", SUCCESS_REWARD, True, False, {}
        return "Wrong.", 0.0, self.turn >= self.max_turns, False, {}

    def solution(self):
        return "\\boxed{%s}" % self.colour
