"""Attack: run a shell through subprocess to write a file on the host (kwargs['path'])."""

import subprocess


class SubprocessEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.path = kwargs.get("path", "/tmp/spade_hostile_subprocess")

    def reset(self, seed=None):
        subprocess.run(["/bin/sh", "-c", f"echo pwned > {self.path}"], check=True)
        return "shell ran", {}

    def step(self, action):
        return "done", 0.0, True, False, {}
