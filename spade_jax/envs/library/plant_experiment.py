"""Plant experiment: run growth trials with a tool to find which factors are required.

Skill: causal inference. Kind: tool use.
"""

import json
import random

from spade_jax.envs import ToolUseEnv

NUM_FACTORS = 3  # allowed: 2..6, factors you can give the plant
NUM_CAUSES = 1  # allowed: 1..2, factors the plant needs all at once to grow
LEVELS = {"easy": (2, 1), "medium": (4, 1), "hard": (6, 2)}

FACTORS = ["water", "light", "heat", "soil", "music", "sugar"]


class PlantExperimentEnv(ToolUseEnv):
    """The plant grows only when every required factor is given; find the required ones."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "experiment",
        "description": "Give the plant some factors (comma-separated) and see whether it grows.",
        "parameters": {"type": "object", "properties": {"factors": {"type": "string"}},
                       "required": ["factors"]},
    }}]

    def __init__(self, max_turns=10, difficulty=None, **kwargs):
        global NUM_FACTORS, NUM_CAUSES
        if difficulty is not None:
            NUM_FACTORS, NUM_CAUSES = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.factors = rng.sample(FACTORS, NUM_FACTORS)
        self.causes = sorted(rng.sample(self.factors, NUM_CAUSES))
        self.expected_answer = ", ".join(self.causes)
        observation = (
            f"A plant grows only when it gets all of its {NUM_CAUSES} required factor(s); "
            "other factors do nothing. "
            f"Factors: {', '.join(self.factors)}. Find the required factor(s) by experiment. "
            "Answer with their names in alphabetical order, separated by commas."
        )
        return observation, {}

    def tool_experiment(self, factors):
        given = [name.strip().lower() for name in str(factors).split(",") if name.strip()]
        unknown = [name for name in given if name not in self.factors]
        if unknown:
            return f"Unknown factor {unknown[0]!r}. Factors: {', '.join(self.factors)}."
        grows = all(cause in given for cause in self.causes)
        return f"With {', '.join(given) or 'nothing'}: the plant {'grows' if grows else 'does not grow'}."

    def check_answer(self, answer):
        return sorted(name.strip().lower() for name in answer.split(",") if name.strip()) == self.causes

    def closeness(self, answer):
        given = {name.strip().lower() for name in answer.split(",") if name.strip()}
        return len(given & set(self.causes)) / len(given | set(self.causes))

    def solution(self):
        lines = [_tool_call("experiment", factors=", ".join(f for f in self.factors if f != left_out))
                 for left_out in self.factors]
        lines.append(f"<answer>{self.expected_answer}</answer>")
        return "\n".join(lines)


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
