"""Attack: crash the interpreter in C (a read of address 0: the worker dies of SIGSEGV)."""

import ctypes


class SegfaultEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return str(ctypes.string_at(0)), {}

    def step(self, action):
        return "never", 0.0, True, False, {}
