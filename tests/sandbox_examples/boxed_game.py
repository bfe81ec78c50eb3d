"""A well-behaved \\boxed{} game for the sandbox tests: reach a target sum with few additions."""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed


class SumTargetEnv:
    """Start at 0; each turn add 1, 2 or 3 (as \\boxed{n}); land exactly on the target to win."""

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = rng.randint(4, 3 * (self.max_turns - 1))
        self.total = 0
        self.turn = 0
        self.done = False
        return (f"Reach exactly {self.target} starting from 0. Each turn add 1, 2 or 3, "
                f"written as \\boxed{{n}}. You have {self.max_turns} turns."), {"target": self.target}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        move = extract_boxed(action)
        if move not in ("1", "2", "3"):
            observation, reward, terminated = "Invalid move: answer \\boxed{1}, \\boxed{2} or \\boxed{3}.", 0.0, False
        else:
            self.total += int(move)
            if self.total == self.target:
                observation, reward, terminated = f"Exactly {self.target}. You win!", SUCCESS_REWARD, True
            elif self.total > self.target:
                observation, reward, terminated = f"Overshot: {self.total} > {self.target}.", -0.5, True
            else:
                observation, reward, terminated = f"Total is {self.total}.", 0.0, False
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        return observation, reward, terminated, truncated, {"total": self.total}

    def solution(self):
        moves, left = [], self.target
        while left > 0:
            moves.append(min(3, left))
            left -= moves[-1]
        return "\n".join(f"\\boxed{{{m}}}" for m in moves)
