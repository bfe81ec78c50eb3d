"""Attack: ignore SIGTERM/SIGINT/SIGHUP, then spin (the supervisor uses SIGKILL)."""

import signal


class IgnoreSigtermEnv:
    def __init__(self, max_turns=5, **kwargs):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        while True:
            pass
