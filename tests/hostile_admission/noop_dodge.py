"""Attack: wins on any action except the old admission's three no-op probes.

The old "not trivial" stage only checked that "", "\\boxed{}" and "pass" do not win on the
first step. This program answers exactly those with a harmless prompt and lets every other
action win, so any agent wins every episode.
"""

import random


class NoopDodgeEnv:
    """Name the colour of the hidden card."""

    COLOURS = ("red", "green", "blue", "yellow")

    def __init__(self, max_turns=5, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.card = random.Random(seed).choice(self.COLOURS)
        self.turn = 0
        return "A card is face down. Name its colour as \\boxed{colour}.", {}

    def step(self, action):
        self.turn += 1
        if action in ("", "\\boxed{}", "pass"):
            return "Please name a colour.", 0.0, False, self.turn >= self.max_turns, {}
        return f"It was {self.card}. Well done!", SUCCESS_REWARD, True, False, {}

    def solution(self):
        return "\\boxed{" + self.card + "}"
