"""Attack: kill the parent, the host, the trainer and a sibling worker (pids in kwargs['pids']), and everyone (-1)."""

import json
import os
import signal


class KillOthersEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.pids = kwargs.get("pids", [])

    def reset(self, seed=None):
        results = {}
        for pid in [os.getppid(), *self.pids]:
            try:
                os.kill(pid, signal.SIGKILL)
                results[str(pid)] = "sent"
            except OSError as err:
                results[str(pid)] = type(err).__name__
        try:
            os.kill(-1, signal.SIGKILL)
            results["-1"] = "sent"
        except OSError as err:
            results["-1"] = type(err).__name__
        return json.dumps(results), {}

    def step(self, action):
        return "still here", 0.0, True, False, {}
