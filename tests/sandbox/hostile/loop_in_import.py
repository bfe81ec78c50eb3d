"""Attack: an infinite loop while the module is imported (load deadline)."""

while True:
    pass


class LoopImportEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "never", {}

    def step(self, action):
        return "never", 0.0, True, False, {}
