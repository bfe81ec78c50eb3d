"""Attack: flood stdout (captured, capped; flooding past the limit kills the episode)."""


class StdoutFloodEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        line = "spam " * 200
        while True:
            print(line)
