"""Tallest: compare people two at a time with a tool to find the tallest.

Skill: logical deduction. Kind: tool use.
"""

import json
import random

from spade_jax.envs import ToolUseEnv

NUM_PEOPLE = 4  # allowed: 3..8, people to compare
LEVELS = {"easy": 3, "medium": 5, "hard": 8}

NAMES = ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay", "Gus", "Hal"]


class TallestEnv(ToolUseEnv):
    """Heights are hidden; only pairwise comparisons are allowed. Name the tallest person."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "compare",
        "description": "Say which of two people is taller.",
        "parameters": {"type": "object",
                       "properties": {"first": {"type": "string"}, "second": {"type": "string"}},
                       "required": ["first", "second"]},
    }}]

    def __init__(self, max_turns=10, difficulty=None, **kwargs):
        global NUM_PEOPLE
        if difficulty is not None:
            NUM_PEOPLE = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.people = rng.sample(NAMES, NUM_PEOPLE)
        self.heights = dict(zip(self.people, rng.sample(range(150, 200), NUM_PEOPLE)))
        self.expected_answer = max(self.people, key=self.heights.get)
        observation = (
            f"{', '.join(self.people)} all have different heights, which you cannot see. "
            "Find the tallest person by comparing two people at a time. Answer with a name."
        )
        return observation, {}

    def tool_compare(self, first, second):
        a, b = str(first).strip().title(), str(second).strip().title()
        if a not in self.heights or b not in self.heights:
            return f"Unknown person. People: {', '.join(self.people)}."
        if a == b:
            return "Pick two different people."
        taller, shorter = (a, b) if self.heights[a] > self.heights[b] else (b, a)
        return f"{taller} is taller than {shorter}."

    def closeness(self, answer):
        name = answer.strip().title()
        if name not in self.heights:
            return 0.0
        return sum(self.heights[name] > height for height in self.heights.values()) / (NUM_PEOPLE - 1)

    def solution(self):
        lines, leader = [], self.people[0]
        for person in self.people[1:]:
            lines.append(_tool_call("compare", first=leader, second=person))
            leader = max(leader, person, key=self.heights.get)
        lines.append(f"<answer>{leader}</answer>")
        return "\n".join(lines)


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
