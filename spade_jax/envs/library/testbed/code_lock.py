"""Code lock: find a code of digits; every try is told which of its digits are right.

Skill: logical deduction. Kind: game (multi-turn). Testbed family: one knob, LENGTH.
"""

import random
import re

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

LENGTH = 3  # allowed: 2..10, digits in the code, each from 1 to 4
LEVELS = {"easy": 2, "medium": 4, "hard": 7}


class CodeLockEnv:
    """Each try marks every digit right or wrong; keep the right ones and raise the wrong ones by one.
    Five tries: the fifth wrong one ends the game, lost."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=8, difficulty=None, **kwargs):
        global LENGTH
        if difficulty is not None:
            LENGTH = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code = "".join(rng.choice("1234") for _ in range(LENGTH))
        self.turn, self.done = 0, False
        observation = (
            f"Open a lock whose code is {LENGTH} digits, each from 1 to 4, in 5 tries. "
            f"After each try I say which digits are right. Reply with one try per turn in \\boxed{{}}, "
            f"e.g. \\boxed{{{'1' * LENGTH}}}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = (extract_boxed(action) or "").replace(" ", "")
        if not re.fullmatch(f"[1-4]{{{LENGTH}}}", text):
            return self._result(f"Invalid try. Reply with {LENGTH} digits from 1 to 4.")
        if text == self.code:
            return self._result("Open!", SUCCESS_REWARD, True)
        if self.turn >= 5:
            return self._result("Still locked. Out of tries.", 0.0, True)
        marks = " ".join("right" if a == b else "wrong" for a, b in zip(text, self.code))
        return self._result(f"{' '.join(text)}: {marks}.")

    def solution(self):
        guess, actions = ["1"] * LENGTH, []
        while True:
            actions.append(f"\\boxed{{{''.join(guess)}}}")
            if "".join(guess) == self.code:
                return "\n".join(actions)
            guess = [a if a == b else str(int(a) + 1) for a, b in zip(guess, self.code)]

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
