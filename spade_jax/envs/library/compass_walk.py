"""Compass walk: follow walking directions and report where you end up.

Skill: spatial reasoning. Kind: game (one answer).
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_MOVES = 2  # allowed: 1..8, walking instructions
MAX_STEP = 3  # allowed: 1..9, longest single walk
RELATIVE = 0  # allowed: 0..1, 1 = directions are left/right turns instead of compass points
LEVELS = {"easy": (1, 3, 0), "medium": (3, 5, 0), "hard": (6, 9, 1)}

HEADINGS = ["north", "east", "south", "west"]
VECTORS = {"north": (0, 1), "east": (1, 0), "south": (0, -1), "west": (-1, 0)}


class CompassWalkEnv:
    """Start at (0, 0) facing north, walk as told, and give the final (x, y)."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global NUM_MOVES, MAX_STEP, RELATIVE
        if difficulty is not None:
            NUM_MOVES, MAX_STEP, RELATIVE = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        x, y, heading, parts = 0, 0, 0, []
        for _ in range(NUM_MOVES):
            steps = rng.randint(1, MAX_STEP)
            if RELATIVE:
                turn = rng.choice(["left", "right", "straight"])
                heading = (heading + {"left": -1, "right": 1, "straight": 0}[turn]) % 4
                parts.append(f"walk {steps}" if turn == "straight" else f"turn {turn} and walk {steps}")
            else:
                heading = rng.randrange(4)
                parts.append(f"walk {steps} {HEADINGS[heading]}")
            dx, dy = VECTORS[HEADINGS[heading]]
            x, y = x + dx * steps, y + dy * steps
        self.answer = (x, y)
        self.turn, self.done = 0, False
        observation = (
            "You start at (0, 0) facing north. x grows to the east, y grows to the north.\n"
            f"You {', then '.join(parts)}.\n"
            "Where are you now? Reply with \\boxed{x,y}, e.g. \\boxed{2,-1}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.fullmatch(r"\(?\s*(-?\d+)\s*,\s*(-?\d+)\s*\)?", extract_boxed(action) or "")
        if match is None:
            return self._result("Invalid action. Reply with \\boxed{x,y}, e.g. \\boxed{2,-1}.")
        if (int(match.group(1)), int(match.group(2))) == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong answer.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer[0]},{self.answer[1]}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
