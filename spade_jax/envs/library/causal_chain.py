"""Causal chain: follow cause-and-effect rules to find every event that happens.

Skill: causal inference. Kind: game (one answer).
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_EVENTS = 4  # allowed: 3..8, events A, B, C, ...
NUM_RULES = 3  # allowed: 2..8, cause-and-effect rules drawn (repeats are dropped)
JOINT_RULES = 0  # allowed: 0..1, 1 = some rules need two causes together
LEVELS = {"easy": (3, 2, 0), "medium": (5, 4, 0), "hard": (8, 8, 1)}


class CausalChainEnv:
    """One event is triggered; apply the rules until nothing changes and list what happened."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=3, difficulty=None, **kwargs):
        global NUM_EVENTS, NUM_RULES, JOINT_RULES
        if difficulty is not None:
            NUM_EVENTS, NUM_RULES, JOINT_RULES = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.events = "ABCDEFGH"[:NUM_EVENTS]
        while True:
            order = rng.sample(self.events, NUM_EVENTS)
            self.rules = []
            for _ in range(NUM_RULES):
                effect = rng.randrange(1, NUM_EVENTS)
                count = 2 if JOINT_RULES and effect >= 2 and rng.random() < 0.5 else 1
                rule = (sorted(order[i] for i in rng.sample(range(effect), count)), order[effect])
                if rule not in self.rules:
                    self.rules.append(rule)
            self.trigger = rng.choice(order)
            self.answer = self._consequences()
            if 1 < len(self.answer) < NUM_EVENTS:
                break
        lines = []
        for causes, effect in self.rules:
            verb = "both happen" if len(causes) == 2 else "happens"
            lines.append(f"If {' and '.join(causes)} {verb}, then {effect} happens.")
        self.turn, self.done = 0, False
        observation = (
            "\n".join(lines) + f"\nOnly {self.trigger} is started from outside. Which events happen?\n"
            f"Reply with their letters (including {self.trigger}) in alphabetical order in \\boxed{{}}, "
            "e.g. \\boxed{ABD}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        events = "".join((extract_boxed(action) or "").replace(",", " ").split()).upper()
        if not events or not set(events) <= set(self.events) or len(set(events)) != len(events):
            return self._result("Invalid action. Reply with event letters in \\boxed{}, e.g. \\boxed{ABD}.")
        if sorted(events) == self.answer:
            return self._result("Correct!", SUCCESS_REWARD, True)
        return self._result("Wrong answer.", 0.0, True)

    def solution(self):
        return f"\\boxed{{{''.join(self.answer)}}}"

    def _consequences(self):
        happened = {self.trigger}
        changed = True
        while changed:
            changed = False
            for causes, effect in self.rules:
                if effect not in happened and all(cause in happened for cause in causes):
                    happened.add(effect)
                    changed = True
        return sorted(happened)

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
