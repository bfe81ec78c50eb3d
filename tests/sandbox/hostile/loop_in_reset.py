"""Attack: an infinite loop in reset() (call deadline during start)."""


class LoopResetEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        n = 0
        while True:
            n += 1

    def step(self, action):
        return "never", 0.0, True, False, {}
