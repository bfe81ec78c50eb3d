"""Policy: imports a module outside the allowlist (refused at parse, and at run time by the worker)."""

import socket


class ForbiddenImportEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return socket.gethostname(), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
