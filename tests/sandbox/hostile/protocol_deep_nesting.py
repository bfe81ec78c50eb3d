"""Attack: a well-framed reply nested 300,000 levels deep, written by hand on the protocol channel (fd 3).

A recursive JSON decoder on the trusted side would overflow its stack (RecursionError, or a
crash of the whole host). What should stop it: the host decodes with a bounded depth (or
catches the failure) and answers a protocol error for this episode only.
"""

import os

DEPTH = 300_000


class DeepNestingEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        payload = b'{"ok":true,"value":' + b"[" * DEPTH + b"]" * DEPTH + b"}"
        view = memoryview(len(payload).to_bytes(4, "big") + payload)
        while view:
            view = view[os.write(3, view):]
        return "genuine", 0.0, False, False, {}
