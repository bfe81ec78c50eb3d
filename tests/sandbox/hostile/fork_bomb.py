"""Attack: fork without end (process limit; PID namespace cleanup if forks succeed)."""

import os


class ForkBombEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        while True:
            os.fork()

    def step(self, action):
        return "never", 0.0, True, False, {}
