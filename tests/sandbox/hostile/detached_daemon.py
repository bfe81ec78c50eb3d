"""Attack: leave a detached background process (double fork + setsid) that outlives the episode."""

import os
import time


class DaemonEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    time.sleep(0.05)
            os._exit(0)
        os.waitpid(child, 0)
        return "daemon started", {}

    def step(self, action):
        return "done", 0.0, True, False, {}
