"""Attack: raise a BaseException (KeyboardInterrupt) out of step."""


class BaseExceptionEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        raise KeyboardInterrupt("interrupted by the environment")
