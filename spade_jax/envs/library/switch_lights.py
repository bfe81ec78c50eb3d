"""Switch lights: flip switches to discover which switch controls which light.

Skill: causal inference. Kind: game (multi-turn).
"""

import random

from spade_jax.envs import SUCCESS_REWARD, extract_boxed

NUM_SWITCHES = 3  # allowed: 2..6, switches and lights
LEVELS = {"easy": 2, "medium": 4, "hard": 6}


class SwitchLightsEnv:
    """Experiment with switches, then report the light each switch controls."""

    DIFFICULTY_LEVELS = "easy", "medium", "hard"

    def __init__(self, max_turns=10, difficulty=None, **kwargs):
        global NUM_SWITCHES
        if difficulty is not None:
            NUM_SWITCHES = LEVELS[difficulty]
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        lights = list(range(1, NUM_SWITCHES + 1))
        rng.shuffle(lights)
        self.wiring = lights
        self.lit = [False] * NUM_SWITCHES
        example = " ".join(str(n) for n in range(NUM_SWITCHES, 0, -1))
        self.turn, self.done = 0, False
        observation = (
            f"Switches 1-{NUM_SWITCHES} each control one of lights 1-{NUM_SWITCHES}, in an unknown order. "
            "All lights are off.\n"
            "Flip a switch with \\boxed{flip 1}. When you know the wiring, reply with the light of "
            f"switch 1, switch 2, ... in order, e.g. \\boxed{{answer {example}}}."
        )
        return observation, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        words = (extract_boxed(action) or "").lower().split()
        numbers = [int(word) for word in words[1:] if word.isdigit() and 1 <= int(word) <= NUM_SWITCHES]
        if words[:1] == ["flip"] and len(words) == 2 and len(numbers) == 1:
            light = self.wiring[numbers[0] - 1]
            self.lit[light - 1] = not self.lit[light - 1]
            return self._result(f"You flipped switch {numbers[0]}. " + self._describe())
        if words[:1] == ["answer"] and len(words) == NUM_SWITCHES + 1 and len(numbers) == NUM_SWITCHES:
            if numbers == self.wiring:
                return self._result("Correct wiring!", SUCCESS_REWARD, True)
            return self._result("Wrong wiring.", 0.0, True)
        return self._result(
            "Invalid action. Reply with \\boxed{flip 1}, or \\boxed{answer ...} with one light per switch."
        )

    def solution(self):
        actions = [f"\\boxed{{flip {switch}}}" for switch in range(1, NUM_SWITCHES)]
        actions.append(f"\\boxed{{answer {' '.join(map(str, self.wiring))}}}")
        return "\n".join(actions)

    def _describe(self):
        lit = [str(light) for light in range(1, NUM_SWITCHES + 1) if self.lit[light - 1]]
        return f"Lights on: {', '.join(lit)}." if lit else "All lights are off."

    def _result(self, observation, reward=0.0, terminated=False):
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        if truncated:
            observation += " Out of turns."
        return observation, reward, terminated, truncated, {}
