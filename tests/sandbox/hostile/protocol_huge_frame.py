"""Attack: announce a 4 GiB frame on the protocol channel (the host must not try to buffer it)."""

import os


class HugeFrameEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        os.write(3, b"\xff\xff\xff\xff" + b"A" * 1000)
        return "hello", {}

    def step(self, action):
        return "never", 0.0, True, False, {}
