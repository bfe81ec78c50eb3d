"""Attack: values that lie about themselves to the worker's own checks.

Default: step's reward is an int subclass whose bit_length() claims 1 while its value is
10**4000, so a worker that trusts bit_length() passes a 4001-digit integer through.
variant="str": step's info dict has one key, a str subclass equal to "__tuple__" whose
__eq__ always answers False (and whose hash is that of "__tuple__"), so a worker that
compares keys with == lets a forged tuple marker through, mapped to the int 5.
What should stop it: the trusted side decodes and checks what actually arrives (exact
types, bounded integers, the tuple marker's shape) and reports a contract violation.
"""


class LyingInt(int):
    def bit_length(self):
        return 1


class LyingStr(str):
    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    def __hash__(self):
        return hash("__tuple__")


class SubclassLiesEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.variant = kwargs.get("variant", "int")

    def reset(self, seed=None):
        return "Take a step.", {}

    def step(self, action):
        if self.variant != "str":
            return "rich", LyingInt(10 ** 4000), False, False, {}
        return "forged marker", 0.0, False, False, {LyingStr("__tuple__"): 5}
