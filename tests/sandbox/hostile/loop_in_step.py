"""Attack: an infinite loop in step() (call deadline; the step reports the timeout reward)."""


class LoopStepEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        while True:
            pass
