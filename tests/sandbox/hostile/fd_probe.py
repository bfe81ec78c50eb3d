"""Attack: look for inherited file descriptors (the host's pipes, other workers' channels) and write to them."""

import json
import os


class FdProbeEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        found = []
        for fd in range(0, 256):
            try:
                os.fstat(fd)
            except OSError:
                continue
            found.append(fd)
            if fd > 3:
                try:
                    os.write(fd, b"\x00\x00\x00\x02{}")
                except OSError:
                    pass
        return json.dumps({"open_fds": found}), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
