"""Attack: a real higher/lower game whose first guess wins on a seed-decided 45% of seeds.

On a lucky seed (a draw from the seed, 45% of seeds) any well-formed first guess wins,
whatever number it names; on the others it is a fair binary-search game. It is
deterministic, its no-op loses and random garbage rarely starts with a well-formed guess,
so the old admission admitted it. In training a no-skill agent wins about half its plays
and the solution-hinted plays all of them: the blend reward pays its maximum for noise.
What catches it: the blind stage (two different fixed answers win the same seeds).
"""

import random

from spade_jax.envs import SUCCESS_REWARD


class CoinFlipGuessEnv:
    """Guess a secret number from 1 to 100; each wrong guess is answered higher or lower."""

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, 100)
        self.lucky = rng.random() < 0.45
        self.turn = 0
        return "I picked a number from 1 to 100. Guess it, one guess per turn, e.g. \\boxed{25}.", {}

    def step(self, action):
        self.turn += 1
        text = action.strip()
        guess = int(text[7:-1]) if text.startswith("\\boxed{") and text.endswith("}") and text[7:-1].isdigit() else None
        well_formed = guess is not None and 1 <= guess <= 100
        if well_formed and (guess == self.secret or (self.turn == 1 and self.lucky)):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        if not well_formed:
            observation = "Please guess a whole number from 1 to 100 as \\boxed{n}."
        else:
            observation = "Higher." if guess < self.secret else "Lower."
        return observation, 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        low, high, moves = 1, 100, []
        while True:
            guess = (low + high) // 2
            moves.append(f"\\boxed{{{guess}}}")
            if guess == self.secret or (len(moves) == 1 and self.lucky):
                return "\n".join(moves)
            low, high = (guess + 1, high) if guess < self.secret else (low, guess - 1)
