"""Repeat pattern: continue a repeating block of letters.

Skill: pattern recognition. Kind: game (one answer).
"""

import random

from spade_jax.envs import PARTIAL_CREDIT_SCALE, SUCCESS_REWARD, extract_boxed

PERIOD = 3  # allowed: 2..5, length of the repeating block
NUM_SYMBOLS = 3  # allowed: 2..6, distinct letters the block may use
ANSWER_LENGTH = 1  # allowed: 1..4, letters to give
LEVELS = {"easy": (2, 2, 1), "medium": (3, 4, 2), "hard": (5, 6, 4)}


class RepeatPatternEnv:
    """Given A B C A B C A ..., give the next letters of the repetition."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, partial_credit=False, **kwargs):
        global PERIOD, NUM_SYMBOLS, ANSWER_LENGTH
        if difficulty is not None:
            PERIOD, NUM_SYMBOLS, ANSWER_LENGTH = LEVELS[difficulty]
        self.max_turns = max_turns
        self.partial_credit = partial_credit

    def reset(self, seed=None):
        rng = random.Random(seed)
        block = [rng.choice("ABCDEF"[:NUM_SYMBOLS]) for _ in range(PERIOD)]
        while len(set(block)) == 1:
            block = [rng.choice("ABCDEF"[:NUM_SYMBOLS]) for _ in range(PERIOD)]
        shown_length = 2 * PERIOD + rng.randrange(PERIOD)
        letters = [block[i % PERIOD] for i in range(shown_length + ANSWER_LENGTH)]
        self.answer = letters[shown_length:]
        example = " ".join("AB"[i % 2] for i in range(ANSWER_LENGTH))
        self.turn, self.done = 0, False
        observation = (
            f"These letters repeat a fixed block: {' '.join(letters[:shown_length])} ...\n"
            f"What are the next {ANSWER_LENGTH} letter(s)? Reply with them in \\boxed{{}}, "
            f"separated by spaces, e.g. \\boxed{{{example}}}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        letters = (extract_boxed(action) or "").replace(",", " ").upper().split()
        if not letters or not all(len(letter) == 1 and letter.isalpha() for letter in letters):
            return self._result("Invalid action. Reply with letters in \\boxed{}, e.g. \\boxed{A B}.")
        if letters == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        right = sum(given == letter for given, letter in zip(letters, self.answer))
        reward = PARTIAL_CREDIT_SCALE * right / max(len(letters), ANSWER_LENGTH) if self.partial_credit else 0.0
        return self._result("Wrong answer.", reward, True)

    def solution(self):
        return f"\\boxed{{{' '.join(self.answer)}}}"

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
