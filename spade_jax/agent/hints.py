"""Privileged hints: how regret is measured.

Modes:
  self      the reference's (spade-rl/spade core/hint_generator.py, SelfHintGenerator): the
            policy reads the environment's source under `HINT_SYSTEM_PROMPT` (or the tool-use
            prompt, `HintConfig.game_type`) and writes a hint of 1-3 sentences: strategy and
            answer format, never the exact answer. One batched sampler call for all
            environments, empty hints sampled again (`HintConfig.retries`).
  strategy  a hand-written strategy hint for the seed family the program is nearest to
            (`agent.strategy`); no hint below the match threshold. Offline and never the
            answer of an instance (tests/agent/test_hint_leaks.py): the tiny preset's mode, whose
            bootstrap model cannot write hints.
  solution  a diagnostic upper bound, NOT SPADE's regret: each hinted episode is told the
            whole plan of the environment's own `solution()` for its seed, one numbered
            action per turn (see `rollout.solution_hint`). The hint carries the answer, so
            regret measures how much of the plan the agent can copy, and a designer is
            rewarded for games that cannot be won without it.
  placebo   the noise floor of regret: the hints of mode `placebo_of` (`self`: written by
            the same sampler call; `strategy`: the same strategy hints; `solution`: taken
            from `solution()`) each replaced by neutral advice of the same length
            (`rollout.placebo_hint`), so hinted plays differ from plain ones only by a
            prompt of the same size that carries no information.
  resample  the estimator's own noise floor: each hinted play is a second plain play on the
            same seed (no hint text, its own sampling randomness), so regret measures only
            the noise of comparing K plays with K plays. Unlike `placebo` it changes nothing
            the agent reads, which matters for a policy that a strange hint disturbs.
  none      no hints: hinted plays equal plain plays and regret is 0.

An environment without a text hint (modes `self`, `strategy` and their placebos: every reply
empty, or no strategy family) gets no hinted plays at all (`matched_requests`); a self-written
reply of whitespace alone is the empty hint, played as an empty "HINT: " as the reference does.

The environment source the policy reads in mode `self` is designer-written, so it enters
the hint prompt through `conversation.prompt_text` (clean Unicode, the tokenizer's special
tokens escaped). Hints themselves are cleaned here and escaped again where they enter the
agent's first observation (`Conversation.start`); `solution` hints are cleaned and bounded
by `rollout.solution_hint`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

from spade_jax.agent.conversation import prompt_text
from spade_jax.agent.rollout import EpisodeRequest, placebo_hint
from spade_jax.agent.strategy import strategy_hint
from spade_jax.sampling.chat import complete_chats
from spade_jax.text import clean_text

HINT_MODES = ("self", "strategy", "solution", "placebo", "resample", "none")
TEXT_HINT_MODES = ("self", "strategy")  # the modes whose hint is a text written before play
GAME_TYPES = ("cognitive", "tool_use", "auto")
PROMPT_WORDINGS = ("reference", "rewritten")

# The reference's own two hint prompts, verbatim (spade-rl/spade core/hint_generator.py:24-75, MIT):
# the default wording (`HintConfig.prompt_wording`).
REFERENCE_HINT_SYSTEM_PROMPT = """You are analyzing game source code to generate a solving hint for an LLM player.

CONTEXT: The player sees only text observations and responds with \\boxed{answer}. It CANNOT see the source code - only you can. Your hint will be appended to the player's first observation.

TASK: Read the code carefully. Identify:
1. What puzzle the game presents (from the player's perspective, not the code's)
2. How the correct answer is derived (trace through reset() and the checking logic in step())
3. What answer format is expected (a number, a word, a list, etc.)

WRITE a hint that includes:
- The key insight or strategy for solving this specific puzzle
- The expected answer format (e.g., "answer with a single integer", "answer with a comma-separated list")

RULES:
- Keep it to 1-3 sentences (under 100 words)
- Reference only what the player can SEE in the observation, not code internals
- Be specific to this game - no generic advice like "think carefully" or "consider all possibilities"
- Do NOT reveal the exact answer, but DO explain the approach

GOOD hint example: "The sequence follows a rule where each term is the sum of the two preceding terms. Count the pattern and predict the next value. Answer with a single integer."
BAD hint example: "The self.solution variable stores the answer computed in reset(). Try to think about what it could be."

Output ONLY the hint text. No JSON, no markdown, no labels."""

REFERENCE_TOOL_USE_HINT_SYSTEM_PROMPT = """You are analyzing a MULTI-TURN tool-use environment's source code to write a PROCEDURAL strategy hint for an LLM agent that will play it.

CONTEXT: The agent acts turn-by-turn. It sees ONE user instruction at a time, calls tools with <tool_call>{"name": "...", "arguments": {...}}</tool_call>, reads each tool result, and submits <answer>done</answer> ONLY after every instruction has been satisfied. It CANNOT see the source code - only you can. Your hint is appended to the agent's FIRST observation.

GOAL: The hint must help the agent get UNSTUCK without SOLVING the task for it. Summarize the approach (a lossy plan), never the answer. Discovering the specific values by calling tools is the SKILL being tested - a hint the agent can win by copy-pasting is worthless, and it trains the generator to make games that are unsolvable WITHOUT the leaked answer.

TASK: Read the code and identify the high-level STRATEGY only: which KINDS of tools/operations are involved, the general order of PHASES (which tool's output feeds the next), and which tools are distractors / out-of-scope.

WRITE a hint that:
- Describes the general approach and the order of PHASES in terms of tool ROLES (e.g. "first look up the relevant record, then update it, then organize the files") - NOT a fully filled-in call sequence.
- Tells the agent to act turn-by-turn and submit <answer>done</answer> ONLY after all steps are complete - never jump straight to a final answer.
- Tells the agent to DISCOVER the specific arguments by calling lookup/list tools and reading each user instruction - it must not assume them.
- If an instruction omits a required argument, say to ASK for it (do not guess); if a request is out of scope of the available tools, say to DECLINE.

HARD RULES (these prevent answer leakage - the #1 failure mode):
- NEVER write concrete data values read from the code or hidden state: no exact IDs, names, file names, paths, amounts, dates, or status strings. Use placeholders like <order_id>, <amount>, or phrases like "the order the user names". If you are about to type a specific value (e.g. 'ORD104', 'savings_67890', 'final_report.pdf'), replace it with a placeholder.
- Do NOT emit a complete, copy-pasteable call-by-call walkthrough with all arguments filled in.
- Reference only tool-level behavior the agent can observe - never reveal code internals (state-variable names, exact criteria expressions).
- Keep it to 2-3 sentences (under 100 words). Specific to THIS environment's tools/goal, but VALUE-FREE.
- Do NOT tell the agent to "answer with a single integer/word" or submit a final answer immediately. This is a multi-turn EXECUTION task.

GOOD hint (strategy + placeholders; the agent still must discover specifics):
"Work one instruction at a time. First use the order-lookup tool to find the order the user refers to, then the order-update tool to change its status; afterwards use the file tools to create the destination folder and move the named file into it. Read each tool result and the next instruction to get the exact arguments - don't assume IDs or paths. Submit <answer>done</answer> only after the final instruction is done."

BAD hint (LEAKS THE ANSWER - never do this): "call find_order(order_id='ORD104'), then update_order_status(order_id='ORD104', status='shipped'), then move_file(src='order_summary.txt', dst='/customer/orders/tracking'). Submit <answer>done</answer>." - it hardcodes exact IDs/paths so the agent wins by copying instead of doing the task.

Output ONLY the hint text. No JSON, no markdown, no labels."""

# The same two prompts rewritten: the same rules and examples in other words
# (`HintConfig.prompt_wording="rewritten"`).
HINT_SYSTEM_PROMPT = """You read the source code of a text game and write a hint that helps an LLM player solve it.

SETTING: The player never sees the code, only the text observations, and it answers with \\boxed{answer}. Only you can read the code. Your hint is added to the player's first observation, and it is all the player will ever learn from the code.

FIRST WORK OUT, by reading the code closely and tracing reset() and the checks in step():
1. which puzzle the player is shown, described as the player sees it;
2. how the correct answer follows from what is shown;
3. which form the answer must take (an integer, one word, a list, ...).

THEN WRITE a hint giving:
- the idea or method that solves this particular puzzle;
- the answer format (e.g. "reply with one integer", "reply with a comma-separated list").

RULES:
- 1 to 3 sentences, fewer than 100 words.
- Speak only of what the player can see, never of variables or code.
- Be specific to this game; no empty advice such as "think it through" or "be careful".
- Never give the exact answer; explain the method that finds it instead.

GOOD: "Every term is the sum of the two terms before it, so add the last two shown terms. Reply with one integer."
BAD: "The answer is stored in self.solution by reset(); try to guess it."

Reply with the hint text alone: no JSON, no markdown, no label."""

TOOL_USE_HINT_SYSTEM_PROMPT = """You read the source code of a MULTI-TURN tool-use environment and write a PROCEDURAL hint for the LLM agent that will play it.

SETTING: The agent works turn by turn and only ever sees text. It sees one user instruction at a time, calls tools as <tool_call>{"name": "...", "arguments": {...}}</tool_call>, reads every result, and replies <answer>done</answer> only once every instruction is carried out. It never sees the code. Your hint is added to its first observation.

PURPOSE: Help the agent get unstuck without doing the task for it. Give the plan in outline, never the answer: finding the concrete values with the tools is exactly the skill under test. A hint that can be copied to win is worthless, and rewards designers for games that cannot be won without the leak.

FIRST WORK OUT only the strategy: which KINDS of tools or operations matter, in which order the PHASES come (whose output feeds which call), and which tools are distractions or out of scope.

THEN WRITE a hint that:
- names the phases by the ROLE of their tools (e.g. "look the record up, then change it, then file it"), not as a filled-in list of calls;
- tells the agent to go turn by turn and to reply <answer>done</answer> only when every step is finished;
- tells it to FIND the concrete arguments with lookup or list tools and from each instruction, never to assume them;
- says to ASK when an instruction leaves out a required argument, and to DECLINE a request no tool covers.

HARD RULES (a leaked answer is the most common failure):
- NO concrete values taken from the code or its hidden state: no IDs, names, file names, paths, amounts, dates or status words. Write placeholders such as <order_id> or <amount>, or "the order the user means".
- NO complete call-by-call walkthrough with its arguments filled in.
- If you are about to write a specific value (an ID like 'ORD104', an account, a file name like 'report.pdf'), write a placeholder instead.
- Describe only tool behaviour the agent can observe, never code internals (variable names, exact conditions).
- 2 to 3 sentences, fewer than 100 words, specific to THIS environment's tools and goal yet free of values.
- Do NOT ask for one integer or word, or for an immediate final answer: this is a multi-turn task to carry out.

GOOD: "Take the instructions one at a time. Find the order the user means with the order lookup tool, then change its status with the update tool; after that, create the target folder with the file tools and move the named file there. Take every exact argument from the tool results and the instructions, and reply <answer>done</answer> only after the last instruction."
BAD (leaks): "call find_order(order_id='ORD104'), then update_order_status(order_id='ORD104', status='shipped'), then move_file(src='order_summary.txt', dst='/customer/orders/tracking'). Reply <answer>done</answer>." - the agent wins by copying, without doing the task.

Reply with the hint text alone: no JSON, no markdown, no label."""

HINT_USER_TEMPLATE = "Environment code:\n```python\n{code}\n```"  # hint_generator.py:154 and 246
_TOOL_USE_CLASS = re.compile(r"^class\s+\w+\s*\(\s*ToolUseEnv\s*\)", re.MULTILINE)
_JSON_BLOCK = re.compile(r"```json\s*\n?(.*?)\n?```", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class HintConfig:
    """How hints are had and, in mode `self`, sampled (see the module docstring for the modes).

    `placebo_of`: the mode whose hints mode `placebo` imitates. `game_type` picks the prompt
    as the reference's run-level `game_type` does (types.py:208, hint_generator.py:78-82):
    "cognitive" the game prompt, "tool_use" the tool-use prompt; "auto" (a deviation, off
    by default) picks per program, the tool-use prompt for a `ToolUseEnv` subclass.
    `prompt_wording`: "reference" the reference's prompts verbatim, "rewritten" the same rules
    and examples in spade_jax's words.
    Sampling follows the reference (types.py:154, hint_generator.py:183-196): temperature
    0.3, the whole program shown, up to `max_new_tokens`, and a hint that comes back empty
    is sampled again `retries` times (3 attempts in all); the reply is kept whole.
    """

    mode: str = "self"
    placebo_of: str = "self"
    game_type: str = "cognitive"
    prompt_wording: str = "reference"
    max_new_tokens: int = 4096
    temperature: float = 0.3
    top_p: float = 1.0
    top_k: int = 0
    retries: int = 2

    def __post_init__(self):
        if self.mode not in HINT_MODES:
            raise ValueError(f"hint mode {self.mode!r} is unknown; choose one of {HINT_MODES}")
        if self.placebo_of not in (*TEXT_HINT_MODES, "solution"):
            raise ValueError(f"hints.placebo_of must be one of {(*TEXT_HINT_MODES, 'solution')}, "
                             f"got {self.placebo_of!r}")
        if self.game_type not in GAME_TYPES:
            raise ValueError(f"hints.game_type must be one of {GAME_TYPES}, got {self.game_type!r}")
        if self.prompt_wording not in PROMPT_WORDINGS:
            raise ValueError(f"hints.prompt_wording must be one of {PROMPT_WORDINGS}, got {self.prompt_wording!r}")
        if self.retries < 0:
            raise ValueError(f"hints.retries must be >= 0, got {self.retries}")

    @property
    def text_mode(self) -> str | None:
        """The mode whose hint text is shown: `mode` itself, or what a placebo imitates."""
        mode = self.placebo_of if self.mode == "placebo" else self.mode
        return mode if mode in TEXT_HINT_MODES else None


def system_prompt(code: str, game_type: str = "cognitive", wording: str = "reference") -> str:
    """The hint prompt for ``code``: by ``game_type`` and ``wording`` (see `HintConfig`)."""
    tool_use = game_type == "tool_use" or (game_type == "auto" and _TOOL_USE_CLASS.search(code) is not None)
    if wording == "reference":
        return REFERENCE_TOOL_USE_HINT_SYSTEM_PROMPT if tool_use else REFERENCE_HINT_SYSTEM_PROMPT
    return TOOL_USE_HINT_SYSTEM_PROMPT if tool_use else HINT_SYSTEM_PROMPT


def hint_chat(code: str, cfg: HintConfig, tokenizer) -> list[dict]:
    """The two messages that ask for one program's hint (the program escaped by `prompt_text`)."""
    return [
        {"role": "system", "content": system_prompt(code, cfg.game_type, cfg.prompt_wording)},
        {"role": "user", "content": HINT_USER_TEMPLATE.format(code=prompt_text(tokenizer, code))},
    ]


def clean_hint(text: str) -> str | None:
    """The hint in a reply: cleaned and stripped, a fenced JSON object's "hint" taken out of
    it (hint_generator.py:132-149).

    None for an empty reply (the reference raises on it and samples again); a reply of
    whitespace alone is the empty hint "", shown as an empty "HINT: " (the reference strips
    it and plays with it, hint_generator.py:217-226)."""
    if not text:
        return None
    text = clean_text(text).strip()
    block = _JSON_BLOCK.search(text)
    if block:
        try:
            data = json.loads(block.group(1).strip())
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("hint"), str):
            text = data["hint"].strip()
    return text


def write_hints(policy, programs: Sequence[str], cfg: HintConfig, *, seed: int = 0) -> list[str | None]:
    """One hint per program for the text modes (`HintConfig.text_mode`), its placebo of the same
    length in mode `placebo`; None for the other modes and where no hint could be had.

    Mode `self` samples all programs in one batched call, then again those whose hint came
    back empty, up to `cfg.retries` more times (each with its own seed). Mode `strategy`
    takes `strategy.strategy_hint` and needs no policy.
    """
    mode = cfg.text_mode
    if mode == "strategy":
        hints = [strategy_hint(code) for code in programs]
    elif mode == "self":
        hints = _sample_hints(policy, programs, cfg, seed)
    else:
        return [None] * len(programs)
    if cfg.mode == "placebo":
        return [placebo_hint(len(h)) if h is not None else None for h in hints]
    return hints


def _sample_hints(policy, programs: Sequence[str], cfg: HintConfig, seed: int) -> list[str | None]:
    """Self-written hints, retried where empty. A program whose hint prompt leaves no room to
    reply in the model's context gets no hint (a designed program may be any length): its
    environment then has no hinted plays, as one whose hint failed. Each reply's budget is
    ``cfg.max_new_tokens`` or the room its prompt leaves, whichever is smaller."""
    tokenizer = policy.tokenizer
    chats = [hint_chat(code, cfg, tokenizer) for code in programs]
    positions = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    room = [cfg.max_new_tokens] * len(chats)
    if positions is not None:
        room = [min(cfg.max_new_tokens, positions - len(tokenizer.apply_chat_template(chat, add_generation_prompt=True)))
                for chat in chats]
    hints: list[str | None] = [None] * len(programs)
    fits = {i for i, r in enumerate(room) if r >= 1}
    for attempt in range(cfg.retries + 1):
        todo = [i for i, h in enumerate(hints) if h is None and i in fits]
        if not todo:
            break
        completions = complete_chats(policy, [chats[i] for i in todo], max_new_tokens=max(room[i] for i in todo),
                                     temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                     seed=seed + attempt, limits=[room[i] for i in todo])
        for i, completion in zip(todo, completions):
            hints[i] = clean_hint(completion.text)
    return hints


def matched_requests(env_key: int, program: str, seeds: Sequence[int], mode: str,
                     hint: str | None = None, placebo_of: str = "self",
                     hinted_seeds: Sequence[int] | None = None) -> list[EpisodeRequest]:
    """The episodes that measure one environment's regret: one plain play per seed, then,
    unless ``mode`` is "none", one hinted play on each of the same seeds (or on each of
    ``hinted_seeds``: the reference seeds its hinted plays apart from the plain ones).

    Modes "self", "strategy" and "placebo" of either show ``hint`` (`write_hints`); when there
    is none (a failed self-written hint, no strategy family) no hinted play is made, as the
    reference gives such an environment no hinted plays and regret 0 (orchestrator.py:1939-1944);
    the empty hint "" is shown as it is. Mode "solution" has the rollout take the plan of the
    environment's `solution()` for the seed, and "placebo" of "solution" a placebo of that
    hint's length; mode "resample" shows nothing.
    """
    if mode not in HINT_MODES:
        raise ValueError(f"hint mode {mode!r} is unknown; choose one of {HINT_MODES}")
    requests = [EpisodeRequest(env_key=env_key, program=program, seed=s) for s in seeds]
    from_solution = mode == "solution" or (mode, placebo_of) == ("placebo", "solution")
    shows_text = mode in TEXT_HINT_MODES or (mode == "placebo" and not from_solution)
    if mode == "none" or (shows_text and hint is None):
        return requests
    return requests + [
        EpisodeRequest(env_key=env_key, program=program, seed=s, hinted=True, hint=hint if shows_text else None,
                       hint_from_solution=from_solution, placebo=(mode, placebo_of) == ("placebo", "solution"))
        for s in (seeds if hinted_seeds is None else hinted_seeds)
    ]
