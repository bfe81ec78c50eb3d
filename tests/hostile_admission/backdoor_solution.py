"""Attack: solution() reads a secret that no play can learn (an oracle).

One guess of a number from 1 to 1000; every seed shows the same observation and a wrong
guess ends the episode, so no agent can do better than 1 in 1000. solution() returns the
secret, so the solution-hinted plays always win: regret 1 for an environment with nothing
to learn. Blind strategies win about 1 in 1000 too, so no blind threshold sees it. What
catches it: feasibility's check that solution() is a play, i.e. that two seeds whose
observations agree so far get the same next action from solution().
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class BackdoorSolutionEnv:
    """Name the number from 1 to 1000 that I am thinking of."""

    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 1000)
        return "I am thinking of a number from 1 to 1000. Name it as \\boxed{n}.", {}

    def step(self, action):
        if extract_boxed(action) == str(self.secret):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        return "Wrong.", 0.0, True, False, {}

    def solution(self):
        return "\\boxed{%d}" % self.secret
