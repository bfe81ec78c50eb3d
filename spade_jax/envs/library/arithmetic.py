"""Arithmetic: compute the value of a short integer expression.

Skill: mathematical reasoning. Kind: game (one answer).
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_OPERANDS = 2  # allowed: 2..4, numbers in the expression
MAX_OPERAND = 9  # allowed: 5..99, largest number in the expression
LEVELS = {"easy": (2, 9), "medium": (3, 20), "hard": (4, 99)}


class ArithmeticEnv:
    """Evaluate an expression such as 7 + 3 * 2; multiplication goes first."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global NUM_OPERANDS, MAX_OPERAND
        if difficulty is not None:
            NUM_OPERANDS, MAX_OPERAND = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        numbers = [rng.randint(1, MAX_OPERAND) for _ in range(NUM_OPERANDS)]
        operators = [rng.choice("+-*") for _ in range(NUM_OPERANDS - 1)]
        terms = [numbers[0]]
        for operator, number in zip(operators, numbers[1:]):
            if operator == "*":
                terms[-1] *= number
            else:
                terms.append(number if operator == "+" else -number)
        self.answer = sum(terms)
        expression = str(numbers[0])
        for operator, number in zip(operators, numbers[1:]):
            expression += f" {operator} {number}"
        self.turn, self.done = 0, False
        observation = (
            f"Compute {expression}. Multiply before you add or subtract.\n"
            "Reply with the integer result in \\boxed{}, e.g. \\boxed{12}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        if text is None or not re.fullmatch(r"-?\d+", text):
            return self._result("Invalid action. Reply with an integer in \\boxed{}, e.g. \\boxed{12}.")
        if int(text) == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong answer.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
