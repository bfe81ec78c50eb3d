"""Attack: write files outside the private directory, including a host path (kwargs['path'])."""

import json


class WriteOutsideEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.targets = [kwargs.get("path", "/tmp/spade_hostile_write"), "/tmp/spade_hostile_write",
                        "/spade_hostile_write", "/dev/spade_hostile_write", "../spade_hostile_write"]

    def reset(self, seed=None):
        results = {}
        for target in self.targets:
            try:
                with open(target, "w") as f:
                    f.write("pwned")
                results[target] = "written"
            except OSError as err:
                results[target] = type(err).__name__
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
