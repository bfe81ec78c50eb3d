"""Knapsack: choose items of the largest total worth that fit in a bag.

Skill: optimization. Kind: game (one answer).
"""

import itertools
import random

from spade_jax.envs import PARTIAL_CREDIT_SCALE, SUCCESS_REWARD, extract_boxed

NUM_ITEMS = 4  # allowed: 3..7, items to choose from
MAX_WEIGHT = 5  # allowed: 2..9, heaviest item in kg
MAX_VALUE = 9  # allowed: 3..20, most valuable item
LEVELS = {"easy": (3, 5, 9), "medium": (5, 7, 12), "hard": (7, 9, 20)}


class KnapsackEnv:
    """Pick a subset of items under the weight limit with the best total worth."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, partial_credit=False, **kwargs):
        global NUM_ITEMS, MAX_WEIGHT, MAX_VALUE
        if difficulty is not None:
            NUM_ITEMS, MAX_WEIGHT, MAX_VALUE = LEVELS[difficulty]
        self.max_turns = max_turns
        self.partial_credit = partial_credit

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.items = {label: (rng.randint(1, MAX_WEIGHT), rng.randint(1, MAX_VALUE))
                      for label in "ABCDEFG"[:NUM_ITEMS]}
        self.capacity = sum(weight for weight, _ in self.items.values()) // 2
        self.best_value, self.best = 0, ""
        for size in range(1, NUM_ITEMS + 1):
            for chosen in itertools.combinations(self.items, size):
                weight, value = self._totals(chosen)
                if weight <= self.capacity and value > self.best_value:
                    self.best_value, self.best = value, "".join(chosen)
        listing = "\n".join(f"{label}: {weight} kg, worth {value}"
                            for label, (weight, value) in self.items.items())
        self.turn, self.done = 0, False
        observation = (
            f"Your bag holds at most {self.capacity} kg. Pack items with the largest total worth.\n"
            f"{listing}\n"
            "Reply with the letters of the items you pack in \\boxed{}, e.g. \\boxed{AC}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        chosen = "".join((extract_boxed(action) or "").replace(",", " ").split()).upper()
        if not chosen or not set(chosen) <= set(self.items) or len(set(chosen)) != len(chosen):
            return self._result("Invalid action. Reply with item letters in \\boxed{}, e.g. \\boxed{AC}.")
        weight, value = self._totals(chosen)
        if weight > self.capacity:
            return self._result(f"Too heavy: {weight} kg.", 0.0, True)
        if value == self.best_value:
            return self._result(f"Correct! Worth {value} is the best possible.", SUCCESS_REWARD, True)
        reward = PARTIAL_CREDIT_SCALE * value / self.best_value if self.partial_credit else 0.0
        return self._result(f"Worth {value}, but {self.best_value} was possible.", reward, True)

    def solution(self):
        return f"\\boxed{{{self.best}}}"

    def _totals(self, chosen):
        return sum(self.items[label][0] for label in chosen), sum(self.items[label][1] for label in chosen)

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
