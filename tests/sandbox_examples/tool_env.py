"""A well-behaved ToolUseEnv for the sandbox tests: find the warehouse shelf that holds an item."""

import random


class ShelfLookupEnv(ToolUseEnv):
    """Ask the inventory tool where items are, then answer with the shelf of the requested item."""

    tools = [{"type": "function", "function": {
        "name": "locate", "description": "Return the shelf that holds an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}}]

    ITEMS = ["bolts", "nails", "glue", "tape", "rope", "wire", "hinges", "screws"]

    def reset(self, seed=None):
        rng = random.Random(seed)
        shelves = rng.sample(range(1, 40), len(self.ITEMS))
        self.shelf_of = {item: f"shelf {n}" for item, n in zip(self.ITEMS, shelves)}
        self.item = rng.choice(self.ITEMS)
        self.expected_answer = self.shelf_of[self.item]
        return f"Which shelf holds the {self.item}? Answer like 'shelf 12'.", {}

    def tool_locate(self, item):
        return self.shelf_of.get(str(item).strip().lower(), "unknown item")

    def solution(self):
        call = '{"name": "locate", "arguments": {"item": "%s"}}' % self.item
        return f"<tool_call>{call}</tool_call>\n<answer>{self.expected_answer}</answer>"
