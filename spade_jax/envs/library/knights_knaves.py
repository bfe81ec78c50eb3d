"""Knights and knaves: decide who tells the truth from what everyone says.

Skill: logical deduction. Kind: game (one answer).
"""

import itertools
import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_PEOPLE = 2  # allowed: 2..4, people on the island
LEVELS = {"easy": 2, "medium": 3, "hard": 4}

CLAIMS = {
    "knight": "{other} is a knight.",
    "knave": "{other} is a knave.",
    "same": "{other} and I are the same kind.",
    "different": "{other} and I are different kinds.",
}
OPPOSITE = {"knight": "knave", "knave": "knight", "same": "different", "different": "same"}


class KnightsKnavesEnv:
    """Knights always tell the truth and knaves always lie; name all the knights."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global NUM_PEOPLE
        if difficulty is not None:
            NUM_PEOPLE = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.people = "ABCD"[:NUM_PEOPLE]
        while True:
            roles = {person: rng.choice([True, False]) for person in self.people}
            claims = [self._make_claim(rng, person, roles) for person in self.people]
            consistent = []
            for values in itertools.product([True, False], repeat=NUM_PEOPLE):
                guess = dict(zip(self.people, values))
                if all(self._is_true(claim, guess) == guess[claim[0]] for claim in claims):
                    consistent.append(guess)
            if len(consistent) == 1:
                break
        self.answer = "".join(person for person in self.people if roles[person]) or "none"
        lines = [f'{speaker} says: "{CLAIMS[kind].format(other=other)}"' for speaker, kind, other in claims]
        self.turn, self.done = 0, False
        observation = (
            "Knights always tell the truth and knaves always lie.\n" + "\n".join(lines) + "\n"
            "Who are the knights? Reply with their letters in alphabetical order in \\boxed{}, "
            "e.g. \\boxed{AC}, or \\boxed{none} if there are no knights."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        text = extract_boxed(action)
        letters = "".join((text or "").replace(",", " ").split()).upper()
        known = letters != "" and set(letters) <= set(self.people) and len(set(letters)) == len(letters)
        if letters != "NONE" and not known:
            return self._result("Invalid action. Reply with knight letters in \\boxed{}, e.g. \\boxed{AC}.")
        if sorted(letters) == sorted(self.answer.upper()):
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong answer.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

    def _make_claim(self, rng, speaker, roles):
        other = rng.choice([person for person in self.people if person != speaker])
        claim = (speaker, rng.choice(list(CLAIMS)), other)
        if self._is_true(claim, roles) != roles[speaker]:
            claim = (speaker, OPPOSITE[claim[1]], other)
        return claim

    def _is_true(self, claim, roles):
        speaker, kind, other = claim
        if kind == "knight":
            return roles[other]
        if kind == "knave":
            return not roles[other]
        return (roles[speaker] == roles[other]) == (kind == "same")

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
