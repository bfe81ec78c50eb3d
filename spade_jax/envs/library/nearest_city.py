"""Nearest city: look up city positions with a tool and pick the closest one.

Skill: spatial reasoning. Kind: tool use.
"""

import json
import random

from spade_jax.envs import ToolUseEnv

NUM_CITIES = 3  # allowed: 2..6, candidate cities
MAP_SIZE = 10  # allowed: 5..50, coordinates run from 0 to MAP_SIZE
LEVELS = {"easy": (2, 10), "medium": (4, 20), "hard": (6, 50)}

CITIES = ["Oslo", "Lima", "Rome", "Cairo", "Delhi", "Quito", "Perth", "Seoul"]


class NearestCityEnv(ToolUseEnv):
    """Locate each candidate city and answer the one closest to home."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "locate",
        "description": "Map position (x, y) of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }}]

    def __init__(self, max_turns=10, difficulty=None, **kwargs):
        global NUM_CITIES, MAP_SIZE
        if difficulty is not None:
            NUM_CITIES, MAP_SIZE = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.cities = rng.sample(CITIES, NUM_CITIES)
            self.home = (rng.randint(0, MAP_SIZE), rng.randint(0, MAP_SIZE))
            self.positions = {city: (rng.randint(0, MAP_SIZE), rng.randint(0, MAP_SIZE))
                              for city in self.cities}
            distances = sorted(self._distance(city) for city in self.cities)
            if distances[0] < distances[1]:
                break
        self.expected_answer = min(self.cities, key=self._distance)
        observation = (
            f"You live at {self.home}. Which of these cities is closest to you, counting distance "
            f"as |dx| + |dy|: {', '.join(self.cities)}? Answer with the city name."
        )
        return observation, {}

    def tool_locate(self, city):
        name = str(city).strip().title()
        if name not in self.positions:
            return f"Unknown city {city!r}. Candidates: {', '.join(self.cities)}."
        return f"{name} is at {self.positions[name]}."

    def closeness(self, answer):
        name = answer.strip().title()
        if name not in self.positions:
            return 0.0
        return (self._distance(self.expected_answer) + 1) / (self._distance(name) + 1)

    def solution(self):
        lines = [_tool_call("locate", city=city) for city in self.cities]
        lines.append(f"<answer>{self.expected_answer}</answer>")
        return "\n".join(lines)

    def _distance(self, city):
        (x, y), (home_x, home_y) = self.positions[city], self.home
        return abs(x - home_x) + abs(y - home_y)


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
