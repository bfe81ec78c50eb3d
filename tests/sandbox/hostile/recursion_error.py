"""Failure: unbounded recursion under the default limit (RecursionError in step)."""


class RecursionErrorEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        return self.step(action)
