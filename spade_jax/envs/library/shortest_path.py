"""Shortest path: explore a road map with a tool and find the cheapest route cost.

Skill: optimization. Kind: tool use.
"""

import heapq
import json
import random

from spade_jax.envs import ToolUseEnv

NUM_TOWNS = 5  # allowed: 3..8, towns on the map
MAX_COST = 9  # allowed: 2..9, most expensive road
EXTRA_ROADS = 2  # allowed: 0..6, roads beyond the ones that connect every town
LEVELS = {"easy": (3, 5, 0), "medium": (5, 9, 2), "hard": (8, 9, 6)}


class ShortestPathEnv(ToolUseEnv):
    """Query the roads out of each town and answer the cheapest cost from A to the last town."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "roads",
        "description": "The two-way roads leaving a town, with their costs.",
        "parameters": {"type": "object", "properties": {"town": {"type": "string"}}, "required": ["town"]},
    }}]

    def __init__(self, max_turns=12, difficulty=None, **kwargs):
        global NUM_TOWNS, MAX_COST, EXTRA_ROADS
        if difficulty is not None:
            NUM_TOWNS, MAX_COST, EXTRA_ROADS = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        towns = "ABCDEFGH"[:NUM_TOWNS]
        self.roads = {town: {} for town in towns}
        pairs = [(towns[rng.randrange(i)], towns[i]) for i in range(1, NUM_TOWNS)]
        others = [(a, b) for i, a in enumerate(towns) for b in towns[i + 1:] if (a, b) not in pairs]
        pairs += rng.sample(others, min(EXTRA_ROADS, len(others)))
        for a, b in pairs:
            self.roads[a][b] = self.roads[b][a] = rng.randint(1, MAX_COST)
        self.goal = towns[-1]
        self.visited, cost = self._dijkstra()
        self.expected_answer = str(cost)
        observation = (
            f"Towns {', '.join(towns)} are joined by two-way roads that cost money to use. "
            f"What is the cheapest total cost to travel from A to {self.goal}? Answer with an integer."
        )
        return observation, {}

    def tool_roads(self, town):
        name = str(town).strip().upper()
        if name not in self.roads:
            return f"Unknown town {town!r}. Towns: {', '.join(self.roads)}."
        listing = ", ".join(f"{other} (cost {cost})" for other, cost in sorted(self.roads[name].items()))
        return f"Roads from {name}: {listing}."

    def solution(self):
        lines = [_tool_call("roads", town=town) for town in self.visited]
        lines.append(f"<answer>{self.expected_answer}</answer>")
        return "\n".join(lines)

    def _dijkstra(self):
        """Towns settled before the goal, in order, and the cheapest cost to it (the map is connected)."""
        queue, settled = [(0, "A")], []
        while True:
            cost, town = heapq.heappop(queue)
            if town in settled:
                continue
            if town == self.goal:
                return settled, cost
            settled.append(town)
            for other, road in self.roads[town].items():
                heapq.heappush(queue, (cost + road, other))


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
