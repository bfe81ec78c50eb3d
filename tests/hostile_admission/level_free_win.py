"""Attack: a fair game at its default level that any reply but a no-op wins at "hard".

The old admission played its random probes at the default level only and tried no more than
the no-op actions at the other levels, which this program lets lose; calibration would then
find "hard" in band for an agent that says anything at all.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NOOPS = ("", "\\boxed{}", "pass", "<answer></answer>", "<tool_call></tool_call>")


class LevelFreeWinEnv:
    """Name the hidden colour."""

    DIFFICULTY_LEVELS = ("easy", "hard")
    COLOURS = ("red", "green", "blue", "yellow", "white", "black", "pink", "grey")

    def __init__(self, max_turns=4, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.free = difficulty == "hard"

    def reset(self, seed=None):
        self.colour = random.Random(seed).choice(self.COLOURS)
        self.turn = 0
        return "A card is face down. Name its colour as \\boxed{colour}.", {}

    def step(self, action):
        self.turn += 1
        if (self.free and action.strip() not in NOOPS) or extract_boxed(action) == self.colour:
            return "Correct.", SUCCESS_REWARD, True, False, {}
        return "Wrong.", 0.0, self.turn >= self.max_turns, False, {}

    def solution(self):
        return "\\boxed{%s}" % self.colour
