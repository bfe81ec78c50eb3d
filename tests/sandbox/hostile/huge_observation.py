"""Failure: reset() returns a 64 MB observation (over the reply size limit)."""


class HugeObservationEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "x" * (64 << 20), {}

    def step(self, action):
        return "never", 0.0, True, False, {}
