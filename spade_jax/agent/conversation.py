"""A multi-turn conversation kept as the exact token ids the policy saw and wrote.

History is never re-rendered: each turn appends the sampled response ids and then the
ids of "end of assistant turn + next user message + assistant header" from the chat
template. The training sequence therefore equals the sampler's context token for
token, and a later KV-cache reuse can extend the cache instead of re-encoding.

Observations come from environment programs (adversarial designer code), so each one
enters the prompt through `prompt_text`: valid Unicode with no control characters
(`spade_jax.text.clean_text`) and no string of a special token of the policy's tokenizer
(`Tokenizer.escape_special`): an observation cannot close the user turn or open another.
`messages` holds the observations as the policy saw them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spade_jax.text import clean_text

_SENTINEL = "\u0000SPADE-ASSISTANT-TURN\u0000"
_OBSERVATION = "\u0000SPADE-OBSERVATION\u0000"


def _turn_suffix(tokenizer, messages: list[dict]) -> str:
    """Text the template puts after an assistant message, up to the next assistant header."""
    rendered = tokenizer.apply_chat_template_text(
        messages
        + [{"role": "assistant", "content": _SENTINEL}, {"role": "user", "content": _OBSERVATION}],
        add_generation_prompt=True,
    )
    if rendered.count(_SENTINEL) != 1:
        raise ValueError("the tokenizer's chat template does not render assistant turns verbatim")
    return rendered.split(_SENTINEL, 1)[1]


def prompt_text(tokenizer, text: str, limit: int | None = None) -> str:
    """Text from outside the policy (an environment, a hint, a transcript) as it may enter a prompt."""
    return tokenizer.escape_special(clean_text(text, limit))


@dataclasses.dataclass
class Conversation:
    """Token ids, which of them the policy generated, and their sampler log-probs."""

    tokens: list[int]
    generated: list[bool]
    logprobs: list[float]
    messages: list[dict]
    suffix_template: str

    @classmethod
    def start(cls, tokenizer, system: str, first_observation: str) -> "Conversation":
        """The system prompt (trusted) and the first observation (escaped: `prompt_text`).

        An empty `system` means no system turn: the conversation opens with the observation,
        as the reference's actor prompt does (one user message, spade-rl/spade
        core/orchestrator.py:256-266). The chat template may still add its own default.
        """
        first_observation = prompt_text(tokenizer, first_observation)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": first_observation})
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        return cls(ids, [False] * len(ids), [0.0] * len(ids), messages, _turn_suffix(tokenizer, messages))

    def __len__(self) -> int:
        return len(self.tokens)

    def add_response(self, ids, logprobs, text: str) -> None:
        self.tokens.extend(int(i) for i in ids)
        self.generated.extend([True] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.messages.append({"role": "assistant", "content": text})

    def add_observation(self, tokenizer, observation: str, response_finished: bool) -> None:
        """Closes the assistant turn (unless its stop token was sampled) and opens the next one.

        `observation` is escaped (`prompt_text`) before it is encoded.
        """
        observation = prompt_text(tokenizer, observation)
        before, after = self.suffix_template.split(_OBSERVATION, 1)
        if response_finished:
            # The sampled stop token already closed the turn: drop the template's own copy.
            stop_text = tokenizer.decode([self.tokens[-1]], skip_special_tokens=False)
            if before.startswith(stop_text):
                before = before[len(stop_text) :]
        ids = tokenizer.encode(before + observation + after)
        self.tokens.extend(ids)
        self.generated.extend([False] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.messages.append({"role": "user", "content": observation})

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.asarray(self.tokens, np.int32),
            np.asarray(self.generated, bool),
            np.asarray(self.logprobs, np.float32),
        )
