"""Attack: replace the worker with another program via exec (no binaries are visible)."""

import os
import sys


class ExecEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        for path in ("/bin/sh", "/usr/bin/python3", sys.executable or "/usr/bin/env"):
            try:
                os.execv(path, [path, "-c", "echo pwned"])
            except OSError:
                continue
        raise RuntimeError("no program could be executed")

    def step(self, action):
        return "done", 0.0, True, False, {}
