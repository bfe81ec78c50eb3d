"""Attack: write a well-framed but malformed message on the protocol channel (fd 3) before replying."""

import os


class ProtocolGarbageEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        payload = b"\xff\xfe not json at all"
        os.write(3, len(payload).to_bytes(4, "big") + payload)
        return "hello", {}

    def step(self, action):
        return "never", 0.0, True, False, {}
