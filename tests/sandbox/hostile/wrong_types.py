"""Failure: step() returns a list with a string reward and integer flags instead of the 5-tuple."""


class WrongTypesEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        return ["obs", "1.0", 1, 0, {}]
