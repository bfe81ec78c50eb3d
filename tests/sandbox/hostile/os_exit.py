"""Attack: os._exit() inside reset (the worker vanishes mid-call)."""

import os


class OsExitEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        os._exit(7)

    def step(self, action):
        return "never", 0.0, True, False, {}
