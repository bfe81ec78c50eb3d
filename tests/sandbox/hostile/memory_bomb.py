"""Attack: allocate and touch memory until something gives (address-space limit)."""


class MemoryBombEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))

    def step(self, action):
        return "never", 0.0, True, False, {}
