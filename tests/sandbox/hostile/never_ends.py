"""Failure: ignores max_turns, so the episode never ends on its own."""


class NeverEndsEnv:
    def __init__(self, max_turns=4, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Keep going.", {}

    def step(self, action):
        return "Keep going.", 0.0, False, False, {}

    def solution(self):
        return "\\boxed{1}"
