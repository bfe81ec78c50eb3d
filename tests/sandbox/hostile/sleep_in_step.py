"""Attack: block forever without using CPU (wall-clock deadline, not the CPU limit)."""

import time


class SleepStepEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        time.sleep(3600)
        return "woke", 0.0, True, False, {}
