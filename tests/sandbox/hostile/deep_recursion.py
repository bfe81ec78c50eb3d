"""Attack: lift the recursion limit and recurse through C (map) until the C stack overflows (segfault)."""

import sys


def dive(n):
    return sum(map(dive, [n + 1]))


class DeepRecursionEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        sys.setrecursionlimit(10 ** 8)
        return str(dive(0)), {}

    def step(self, action):
        return "never", 0.0, True, False, {}
