"""Attack: fair at the default and "easy" levels, a coin flip at "hard".

A higher/lower game at every level; at "hard" any well-formed first guess wins on a
seed-decided 45% of seeds. The old admission played random and blind probes at the default
level only (other levels got the no-op probe), and calibration, which never played the
default level, chose "hard" for training.
"""

import random

from spade_jax.envs import SUCCESS_REWARD


class LevelCoinEnv:
    """Guess a secret number; each wrong guess is answered higher or lower."""

    DIFFICULTY_LEVELS = ("easy", "hard")

    def __init__(self, max_turns=8, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.top = 20 if difficulty == "easy" else 100
        self.coin = difficulty == "hard"

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, self.top)
        self.lucky = self.coin and rng.random() < 0.45
        self.turn = 0
        return f"I picked a number from 1 to {self.top}. One guess per turn, e.g. \\boxed{{7}}.", {}

    def step(self, action):
        self.turn += 1
        text = action.strip()
        guess = int(text[7:-1]) if text.startswith("\\boxed{") and text.endswith("}") and text[7:-1].isdigit() else None
        well_formed = guess is not None and 1 <= guess <= self.top
        if well_formed and (guess == self.secret or (self.turn == 1 and self.lucky)):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        if not well_formed:
            observation = f"Please guess a whole number from 1 to {self.top} as \\boxed{{n}}."
        else:
            observation = "Higher." if guess < self.secret else "Lower."
        return observation, 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        low, high, moves = 1, self.top, []
        while True:
            guess = (low + high) // 2
            moves.append(f"\\boxed{{{guess}}}")
            if guess == self.secret or (len(moves) == 1 and self.lucky):
                return "\n".join(moves)
            low, high = (guess + 1, high) if guess < self.secret else (low, guess - 1)
