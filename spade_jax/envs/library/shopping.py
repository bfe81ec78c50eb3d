"""Shopping: look up prices with a tool and compute the total bill.

Skill: mathematical reasoning. Kind: tool use.
"""

import json
import random

from spade_jax.envs import ToolUseEnv

NUM_ITEMS = 2  # allowed: 1..5, different items on the list
MAX_PRICE = 9  # allowed: 5..50, highest unit price in coins
MAX_QUANTITY = 3  # allowed: 1..4, most units of one item
LEVELS = {"easy": (1, 9, 1), "medium": (3, 20, 3), "hard": (5, 50, 4)}

CATALOG = ["apple", "bread", "milk", "eggs", "cheese", "rice", "tea", "soap"]


class ShoppingEnv(ToolUseEnv):
    """Prices are hidden behind a tool; answer the total cost of the shopping list."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    tools = [{"type": "function", "function": {
        "name": "price",
        "description": "Unit price of an item in coins.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    }}]

    def __init__(self, max_turns=8, difficulty=None, **kwargs):
        global NUM_ITEMS, MAX_PRICE, MAX_QUANTITY
        if difficulty is not None:
            NUM_ITEMS, MAX_PRICE, MAX_QUANTITY = LEVELS[difficulty]
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.prices = {item: rng.randint(1, MAX_PRICE) for item in CATALOG}
        self.basket = {item: rng.randint(1, MAX_QUANTITY) for item in rng.sample(CATALOG, NUM_ITEMS)}
        self.expected_answer = str(sum(self.prices[item] * count for item, count in self.basket.items()))
        listing = ", ".join(f"{count} {item}" for item, count in self.basket.items())
        observation = f"You buy {listing}. What is the total cost in coins? Answer with an integer."
        return observation, {}

    def tool_price(self, item):
        name = str(item).strip().lower()
        if name not in self.prices:
            return f"Unknown item {item!r}."
        return f"One {name} costs {self.prices[name]} coins."

    def closeness(self, answer):
        try:
            given = int(answer.strip())
        except ValueError:
            return 0.0
        expected = int(self.expected_answer)
        return max(0.0, 1.0 - abs(given - expected) / expected)

    def solution(self):
        lines = [_tool_call("price", item=item) for item in self.basket]
        lines.append(f"<answer>{self.expected_answer}</answer>")
        return "\n".join(lines)


def _tool_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
