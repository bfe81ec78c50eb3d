"""Failure: step() returns an info dict holding an object that is not JSON-serialisable."""


class UnencodableInfoEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        return "here is a lock", 0.0, False, False, {"lock": object(), "fine": [1, 2]}
