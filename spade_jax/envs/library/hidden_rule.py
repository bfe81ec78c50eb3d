"""Hidden rule: probe a machine with small inputs and predict a large one.

Skill: pattern recognition. Kind: tool use.
"""

import json
import random

from spade_jax.envs import ToolUseEnv

MAX_COEFF = 5  # allowed: 2..9, largest coefficient a or b
NUM_KINDS = 1  # allowed: 1..2, rule forms: a*x + b, then also a*x*x + b
LEVELS = {"easy": (2, 1), "medium": (5, 1), "hard": (9, 2)}

SMALLEST_TARGET, LARGEST_INPUT = 10, 5


class HiddenRuleEnv(ToolUseEnv):
    """The machine computes a*x + b (or a*x*x + b); find its output for a big x."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "apply",
        "description": f"Run the machine on a whole number x from 0 to {LARGEST_INPUT}.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    }}]

    def __init__(self, max_turns=8, difficulty=None, **kwargs):
        global MAX_COEFF, NUM_KINDS
        if difficulty is not None:
            MAX_COEFF, NUM_KINDS = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(1, MAX_COEFF), rng.randint(0, MAX_COEFF)
        self.squared = NUM_KINDS == 2 and rng.random() < 0.5
        self.target = rng.randint(SMALLEST_TARGET, 2 * SMALLEST_TARGET)
        self.expected_answer = str(self._rule(self.target))
        forms = "a*x + b" if NUM_KINDS == 1 else "a*x + b or a*x*x + b"
        observation = (
            f"A machine turns a number x into {forms}, with secret whole numbers a and b. "
            f"It only accepts x from 0 to {LARGEST_INPUT}. What would it output for x = {self.target}? "
            "Answer with an integer."
        )
        return observation, {}

    def tool_apply(self, x):
        if not isinstance(x, int) or not 0 <= x <= LARGEST_INPUT:
            return f"The machine only accepts whole numbers x from 0 to {LARGEST_INPUT}."
        return f"apply({x}) = {self._rule(x)}"

    def solution(self):
        lines = [_tool_call("apply", x=x) for x in (0, 1, 2)]
        lines.append(f"<answer>{self.expected_answer}</answer>")
        return "\n".join(lines)

    def _rule(self, x):
        return self.a * (x * x if self.squared else x) + self.b


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
