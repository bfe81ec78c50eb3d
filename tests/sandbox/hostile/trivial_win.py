"""Failure: any action (even an empty one) wins, so the game teaches nothing."""


class TrivialWinEnv:
    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything.", {}

    def step(self, action):
        return "You win.", SUCCESS_REWARD, True, False, {}

    def solution(self):
        return "\\boxed{anything}"
