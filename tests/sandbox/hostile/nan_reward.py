"""Failure: step() returns a NaN reward."""


class NanRewardEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        return "reward is NaN", float("nan"), True, False, {}
