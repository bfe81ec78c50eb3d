"""Attack: every call burns a fixed amount of CPU (kwargs['iterations'], default 30M additions), and
the episode never ends by itself.

It never reads a clock (the sandbox's clock may be virtual), so the work is the same
however time is shown to it. What should stop it: per-call deadlines measured on the
host's real clock and the per-episode CPU limit, charging the time to this episode only.
"""


def _burn(iterations):
    total = 0
    for _ in range(iterations):
        total += 1
    return total


class SlowCallsEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.iterations = int(kwargs.get("iterations", 30_000_000))

    def reset(self, seed=None):
        _burn(self.iterations)
        return "slow", {}

    def step(self, action):
        _burn(self.iterations)
        return "slow", 0.0, False, False, {}
