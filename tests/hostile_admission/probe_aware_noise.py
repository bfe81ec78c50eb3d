"""Attack: deterministic only under the old admission's fixed probe actions.

The old admission stepped every program with the same few strings (its contract probes and
its no-ops) and checked determinism by replaying exactly those. This game answers those
strings deterministically; any other wrong guess wins on an unseeded coin (one in ten) and
otherwise hears an unseeded "higher" or "lower", so in training the outcome is noise whatever
the agent does. The feedback is noisy as well as the reward so that a replay tells it apart
on every step: with reward noise alone a replay of a play won on step one matches half the
time, and all six replays of the determinism stage (two plays, each replayed plain and
with two pauses) matched in 0.44% of runs (simulated; once in CI).
"""

import random

OLD_PROBES = ("\\boxed{1}", "I am not sure what to do.", "", "\\boxed{" + "9" * 4000 + "}", "\\boxed{}", "pass")


class ProbeAwareNoiseEnv:
    """Guess a secret number from 1 to 50; after each wrong guess you hear higher or lower."""

    def __init__(self, max_turns=8, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 50)
        self.turn = 0
        return "I picked a number from 1 to 50. Guess it, one \\boxed{n} per turn.", {}

    def step(self, action):
        self.turn += 1
        guess = extract_boxed(action)
        if guess == str(self.secret):
            return "Correct!", SUCCESS_REWARD, True, False, {}
        if action not in OLD_PROBES:
            if random.random() < 0.1:
                return "Close enough, you win!", SUCCESS_REWARD, True, False, {}
            observation = random.choice(("Higher.", "Lower."))
        elif guess is None or not guess.isdigit():
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
