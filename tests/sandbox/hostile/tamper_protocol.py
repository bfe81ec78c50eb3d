"""Attack: tamper with builtins and the worker's JSON encoder so its replies turn into garbage."""

import builtins
import json


class TamperEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        json.dumps = lambda *args, **kwargs: "][ not json"
        builtins.len = lambda obj: 3
        return "tampered", {}

    def step(self, action):
        return "never", 0.0, True, False, {}
