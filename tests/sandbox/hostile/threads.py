"""Attack: start threads (they count against the process limit)."""

import threading


class ThreadsEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        for _ in range(64):
            threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()
        return "threads started", {}

    def step(self, action):
        return "done", 0.0, True, False, {}
