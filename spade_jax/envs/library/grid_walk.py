"""Grid walk: move step by step around walls to reach the goal.

Skill: spatial reasoning. Kind: game (multi-turn).
"""

import collections
import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

GRID_SIZE = 4  # allowed: 3..8, the grid has GRID_SIZE rows and columns
NUM_WALLS = 3  # allowed: 0..6, wall cells
LEVELS = {"easy": (3, 0), "medium": (4, 3), "hard": (5, 6)}

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridWalkEnv:
    """Walk from P to G one cell per turn; walls (#) and the edge block moves."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=30, difficulty=None, **kwargs):
        global GRID_SIZE, NUM_WALLS
        if difficulty is not None:
            GRID_SIZE, NUM_WALLS = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        cells = [(row, col) for row in range(GRID_SIZE) for col in range(GRID_SIZE)]
        while True:
            self.start, self.goal, *walls = rng.sample(cells, NUM_WALLS + 2)
            self.walls = set(walls)
            self.path = self._shortest_path()
            if self.path is not None and len(self.path) <= 3 * GRID_SIZE:
                break
        self.position = self.start
        self.turn, self.done = 0, False
        observation = (
            "Walk from P to G. '#' is a wall; up is the top row.\n" + self._render() + "\n"
            "Move one cell per turn: \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        move = (extract_boxed(action) or "").lower()
        if move not in MOVES:
            return self._result(
                "Invalid action. Reply with \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
            )
        row, col = self.position
        target = (row + MOVES[move][0], col + MOVES[move][1])
        if not self._is_open(target):
            return self._result("Blocked, you did not move.\n" + self._render())
        self.position = target
        if target == self.goal:
            return self._result("You reached G!", SUCCESS_REWARD, True)
        return self._result(f"You moved {move}.\n" + self._render())

    def solution(self):
        return "\n".join(f"\\boxed{{{move}}}" for move in self.path)

    def _is_open(self, cell):
        row, col = cell
        return 0 <= row < GRID_SIZE and 0 <= col < GRID_SIZE and cell not in self.walls

    def _shortest_path(self):
        previous = {self.start: None}
        queue = collections.deque([self.start])
        while queue:
            cell = queue.popleft()
            if cell == self.goal:
                path = []
                while previous[cell] is not None:
                    cell, move = previous[cell]
                    path.append(move)
                return path[::-1]
            for move, (d_row, d_col) in MOVES.items():
                nxt = (cell[0] + d_row, cell[1] + d_col)
                if self._is_open(nxt) and nxt not in previous:
                    previous[nxt] = (cell, move)
                    queue.append(nxt)
        return None

    def _render(self):
        rows = []
        for row in range(GRID_SIZE):
            symbols = []
            for col in range(GRID_SIZE):
                cell = (row, col)
                if cell == self.position:
                    symbols.append("P")
                elif cell == self.goal:
                    symbols.append("G")
                else:
                    symbols.append("#" if cell in self.walls else ".")
            rows.append(" ".join(symbols))
        return "\n".join(rows)

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
