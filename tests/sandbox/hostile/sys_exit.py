"""Attack: sys.exit() inside step (SystemExit must not take the worker's protocol down silently)."""

import sys


class SysExitEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        sys.exit(0)
