"""Attack: flood stderr with raw writes to fd 2."""

import os


class StderrFloodEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        chunk = b"E" * 65536
        while True:
            os.write(2, chunk)

    def step(self, action):
        return "never", 0.0, True, False, {}
