"""Attack: a difficulty level that cannot be won.

At "hard" the target is out of reach of the allowed moves, so neither the solution nor any
agent can win there; the old admission replayed solution() at the default level only.
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class LevelInfeasibleEnv:
    """Reach the target sum exactly by adding 1, 2 or 3 per turn."""

    DIFFICULTY_LEVELS = ("easy", "hard")

    def __init__(self, max_turns=8, difficulty=None, **kwargs):
        self.max_turns = max_turns
        self.difficulty = difficulty

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = rng.randint(4, 12)
        if self.difficulty == "hard":
            self.target += 100  # more than 8 moves of at most 3 can add
        self.total, self.turn = 0, 0
        return f"Reach exactly {self.target}. Each turn add \\boxed{{1}}, \\boxed{{2}} or \\boxed{{3}}.", {}

    def step(self, action):
        self.turn += 1
        move = extract_boxed(action)
        if move in ("1", "2", "3"):
            self.total += int(move)
        if self.total == self.target:
            return "Exactly!", SUCCESS_REWARD, True, False, {}
        if self.total > self.target:
            return f"Overshot: {self.total}.", 0.0, True, False, {}
        return f"Total is {self.total}.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        moves, left = [], self.target
        while left > 0:
            moves.append(min(3, left))
            left -= moves[-1]
        return "\n".join(f"\\boxed{{{m}}}" for m in moves)
