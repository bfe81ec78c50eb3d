"""Job order: schedule jobs on one machine to finish them as early as possible.

Skill: optimization. Kind: game (multi-turn).
"""

import itertools
import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_JOBS = 3  # allowed: 2..6, jobs to schedule
MAX_DURATION = 5  # allowed: 2..9, longest job in hours
WEIGHTED = 0  # allowed: 0..1, 1 = jobs have priorities that multiply their finish times
LEVELS = {"easy": (2, 5, 0), "medium": (4, 7, 0), "hard": (6, 9, 1)}


class JobOrderEnv:
    """Pick the next job each turn; win if the weighted sum of finish times is minimal."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=10, difficulty=None, **kwargs):
        global NUM_JOBS, MAX_DURATION, WEIGHTED
        if difficulty is not None:
            NUM_JOBS, MAX_DURATION, WEIGHTED = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.jobs = {label: (rng.randint(1, MAX_DURATION), rng.randint(1, 3) if WEIGHTED else 1)
                     for label in "ABCDEF"[:NUM_JOBS]}
        self.best = min(itertools.permutations(self.jobs), key=self._cost)
        self.order, self.clock = [], 0
        if WEIGHTED:
            listing = ", ".join(f"{label} takes {hours} h (priority {weight})"
                                for label, (hours, weight) in self.jobs.items())
            goal = "the sum of priority times finish time"
        else:
            listing = ", ".join(f"{label} takes {hours} h" for label, (hours, _) in self.jobs.items())
            goal = "the sum of the finish times"
        self.turn, self.done = 0, False
        observation = (
            f"One machine runs these jobs one after another, starting at time 0: {listing}. "
            f"Choose the order that makes {goal} as small as possible.\n"
            "Each turn, reply with the next job in \\boxed{}, e.g. \\boxed{A}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        job = (extract_boxed(action) or "").strip().upper()
        if job not in self.jobs or job in self.order:
            return self._result("Invalid action. Reply with a job that has not run yet, e.g. \\boxed{A}.")
        self.order.append(job)
        self.clock += self.jobs[job][0]
        remaining = [label for label in self.jobs if label not in self.order]
        if remaining:
            return self._result(f"{job} finishes at time {self.clock}. Remaining: {', '.join(remaining)}.")
        cost, best_cost = self._cost(self.order), self._cost(self.best)
        if cost == best_cost:
            return self._result(f"All jobs done. Total {cost} is optimal!", SUCCESS_REWARD, True)
        return self._result(f"All jobs done. Total {cost}, but {best_cost} was possible.", 0.0, True)

    def solution(self):
        return "\n".join(f"\\boxed{{{job}}}" for job in self.best)

    def _cost(self, order):
        clock, total = 0, 0
        for job in order:
            hours, weight = self.jobs[job]
            clock += hours
            total += weight * clock
        return total

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
