"""Attack: one uninformative guess, the secret as the solution, a seed-decided 45% win.

One guess of a number from 1 to 10; on a lucky seed (45% of seeds) any well-formed guess
wins, on the others only the secret does, and nothing in the observation tells them apart.
solution() names the secret, so solution-hinted plays always win while a no-skill agent
wins about half: regret and the plateau are paid for a coin. The observation carries a
round number taken from the seed, so seeds never show the same observation and the
solution cannot be caught reading hidden state (that check, in feasibility, compares
seeds whose observations agree). What catches it: the blind stage.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class OneShotCoinEnv:
    """Guess the number from 1 to 10 I am thinking of. One guess."""

    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, 10)
        self.lucky = rng.random() < 0.45
        self.round = (seed or 0) % 100000
        return f"Round {self.round}: I am thinking of a number from 1 to 10. One guess, as \\boxed{{n}}.", {}

    def step(self, action):
        guess = extract_boxed(action)
        well_formed = guess in [str(n) for n in range(1, 11)]
        if well_formed and (self.lucky or guess == str(self.secret)):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        return f"No, it was {self.secret}.", 0.0, True, False, {}

    def solution(self):
        return "\\boxed{%d}" % self.secret
