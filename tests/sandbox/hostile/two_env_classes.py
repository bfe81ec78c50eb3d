"""Failure: defines two classes ending in Env (the loader needs exactly one)."""


class FirstEnv:
    def __init__(self, max_turns=3, **kwargs):
        pass

    def reset(self, seed=None):
        return "first", {}

    def step(self, action):
        return "first", 0.0, True, False, {}


class SecondEnv(FirstEnv):
    pass
