"""ACEBench agent categories (`acebench-agent[:DIR]`): multi_step and multi_turn as multi-turn episodes.

ACEBench (chenchen0103/ACEBench, MIT) has two agent categories on a simulated phone (messages,
reminders, food delivery) and airline: ``agent_multi_step`` (20 items: the task is given at
once and the agent calls APIs step by step) and ``agent_multi_turn`` (30 items: a simulated
user who knows the task talks with the agent). DIR is found as the ``acebench`` suite finds it
(`acebench.find_data`; a folder holding only the agent files also does); without DIR,
``config.eval.acebench_dir``. Nothing is downloaded.

Items: one episode per data line, played in this process by `AgentPool` (the sandbox pool's
calls) on the simulated APIs of `acebench_apis`. The first observation is upstream's agent
prompt: its instructions (for multi_turn with the phone or airline policy appended), the
function list as upstream writes it (``str`` of the list) and the conversation so far
(``user:`` and the task, or the simulated user's opening line). A reply is read as upstream
reads it: the whole reply (brackets added where missing) must be a list of calls
``[Api(key=value, ...)]``, parsed with `acebench.parse_calls` (literal arguments only, never
run as code); the calls run on the item's API instances and the next observation is
``execution result:`` (multi_step) or ``execution:`` (multi_turn) and the results. A call of an
API the scenario does not have (``__import__``, ``os.system``, a made-up name) gets an error
result. A multi_step reply that is not a list of calls gets upstream's answer ("Please do not
ask me any questions, ..."); in multi_turn it goes to the simulated user, whose line is the
next observation (``user:``). A reply or user line containing ``finish conversation`` ends the
episode (not the agent's first reply, as upstream); upstream's dialogue of at most 40 messages
(agent, execution and user together) truncates it.

The simulated user plays upstream's user prompt with the item's instruction. By default it is
the evaluated policy itself (greedy, `complete_chats`); with ``config.eval.user_endpoint`` (the
base URL of any OpenAI-compatible server, ``http://host:port/v1``: vLLM, SGLang,
``python -m spade_jax.serve``) it is that server's model (`EndpointUser`, greedy). Upstream uses
gpt-4o, so multi_turn scores are comparable to published numbers only with such a user; the
summary's notes and every multi_turn item's ``details["user"]`` say which user played.

Scoring follows upstream's ``eval_main.agent_eval`` and ``checker.agent_checker``. The end
state is the saved attributes of every involved class after the episode (none when no reply
was ever executed); it matches when it has as many classes as the answer and, for each answer
class found by name, every saved attribute is in the answer and equal to it, attributes held
as dicts compared on the answer's keys only. Upstream's quirks stay: an answer class whose name
is no API class (``ReminderAPI``, ``Reminderpi``, ``BaseAPI`` in the English data) is not
checked, and extra keys (an extra message) are not noticed. Score.value is the end state (1 or
0); ``details["process_accuracy"]`` is upstream's process accuracy: the fraction of the
answer's milestone replies found in order among the executed replies (stripped text equal; the
best of alternative milestone lists; 1 when the end state matches); ``details["diff"]`` says
what differs. The score replays exactly what the pool executed: every reply whole, as
``read_action`` handed it to the pool (not the agent's parsed action, cut at 512 characters),
so its verdict is the pool's end-of-episode reward.

Bounds (`spade_jax.evals.bounded`): a reply's arguments are bounded in size as
`acebench.parse_calls` bounds them (a reply past them does not parse and runs nothing); an
item whose executions take over ``work_s`` seconds (default `bounded.ITEM_WORK_S`) ends failed
with the reason and scores 0; the simulated user's reply budget is fitted to the room its
chat leaves in the model, and an episode whose user chat has none ends with that reason.

Where this differs from upstream: every episode starts from fresh instances (upstream keeps
them in globals named by the item's number, shared by ``agent_multi_step_3`` and
``agent_multi_turn_3`` in one process); an argument that is itself a call is passed as data,
not run; the simulated user's own lines are sent as assistant turns (upstream gives them the
role ``system``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

from spade_jax.agent.conversation import prompt_text
from spade_jax.evals import bounded
from spade_jax.evals.registry import register
from spade_jax.evals.suite import (BENCHMARK_SYSTEM_PROMPT, Context, GenerationSettings, InProcessPool, Item,
                                   Score, SuiteUnavailable, spread)
from spade_jax.evals.suites import acebench
from spade_jax.evals.suites.acebench_apis import CLASSES, Scenario
from spade_jax.sandbox.records import StepResult
from spade_jax.seeds import derive_seed

CATEGORIES = ("agent_multi_step", "agent_multi_turn")
MAX_DIALOG_MESSAGES = 40  # upstream's max_dialog_turns: agent, execution and user messages together
FINISH = "finish conversation"
NUDGE = "Please do not ask me any questions, use the known conditions to solve the problem"
USER_OPENING_EN = "Is there anything you need help with today?"

# ---------------------------------------------------------------------------------------------
# Prompts: upstream's model_inference/multi_step/APIModel_agent.py, multi_turn/APIModel_agent.py,
# multi_turn/APIModel_user.py and prompt_en.py (English), verbatim.

MULTI_STEP_AGENT_SYSTEM_EN = """You are an AI system with the role of 'system'. Based on the provided API documentation and the conversation history from steps 1 to t, generate the corresponding content for the 'system' role in step t+1.
1. If the information provided in the previous step is complete and allows for a successful API call, you should output the API request(s) to be called in the format [ApiName(key1='value1', key2='value2', ...)]. Replace ApiName with the actual API name, key1, key2, etc., with the actual parameter names, and value1, value2, etc., with the actual parameter values. The output should start with a square bracket "[" and end with a square bracket "]". If there are multiple API requests, separate them with commas, for example, [ApiName(key1='value1', key2='value2', ...), ApiName(key1='value1', key2='value2', ...), ...]. Do not include any additional explanations, prompts, or API call results in the output.
   - If the API parameter description does not specify otherwise, the parameter is optional (only include parameters mentioned in the user input; if not mentioned, do not include them).
   - If the API parameter description does not specify a required value format, use the user's original input for the parameter value.
2. If a task requires multiple steps to complete (with strict sequential relationships between steps), execute them step by step, and decide how to proceed based on the results returned from each execution.
3. Generally do not use parallel calls, meaning only one function is called at a time.

Please note that if an API call is needed, strictly adhere to the calling rules [ApiName(key1='value1', key2='value2', ...)] and do not output any other content.
When you believe the task is completed, return "finish conversation" to end the dialogue.

Role Descriptions:
user: The user
agent: The AI system role that performs API requests
execution: Executes API calls and returns results
"""

MULTI_STEP_AGENT_USER_EN = """Below is the list of APIs you can call (in JSON format): {functions}. Conversation history: {history}
"""

MULTI_TURN_AGENT_SYSTEM_EN = """You are an AI system with the role name "system." Based on the provided API specifications and conversation history from steps 1 to t, generate the appropriate content for step t+1 for the "system" role.
1. If the information provided in the previous step is complete and the API call can be executed normally, you should generate the API request. The API request should be output in the format [ApiName(key1='value1', key2='value2', ...)]. Do not include any other explanations, prompts, or API call results in the output.
   - If the API parameter description does not specify otherwise, the parameter is optional (parameters mentioned in the user input need to be included in the output; if not mentioned, they do not need to be included).
   - If the API parameter description does not specify the required format for the value, use the user's original text for the parameter value.
2. If the information you received is incomplete, you need to ask the user for more information to obtain the complete details. You should not pretend to be the user to answer some clerical questions; instead, promptly ask the user for clarification.

Please note that if an API call is required, strictly adhere to the call format rules [ApiName(key1='value1', key2='value2', ...)] and do not output any other text content.

Role Descriptions:
user: User
agent: The AI system role that makes API requests
execution: Executes the API call and returns the result

The rules you need to follow are as follows:

"""

MULTI_TURN_AGENT_USER_EN = """Below is the list of APIs you can use:
 {functions}

Conversation history 1..t:
{history}"""

TRAVEL_PROMPT_EN = """The current time is July 15, 2024, 08:00 (Beijing Time). As an airline agent, you can help users book, modify, or cancel flight reservations.

Before performing any operations that update the reservation database (such as booking, modifying flights, editing baggage, upgrading cabins, updating passenger information), you must list the operation details and obtain explicit confirmation ("Yes") from the user before proceeding. However, you do not need to repeatedly confirm the same type of information with the user.
You should not provide information, knowledge, or procedures that are not provided by the user or available tools, nor should you offer subjective advice or comments.
Only one tool can be called at a time, but parallel calls of the same tool are allowed. Do not reply to the user while calling a tool, and do not call a tool while replying to the user.
You should refuse any user requests that violate this policy.
Only when a request is beyond your executable scope should you transfer the user to a human agent.

Basic Domain Information
Each user has a profile that includes a user ID, payment method, reservation number, and membership level.
Each reservation includes a reservation ID, user ID, flight, payment method, baggage, and seat type, among others.
Each flight includes a flight number, departure location, destination, scheduled departure and arrival times (local time), and the number of remaining seats:

Booking Flights
The agent must first obtain the user ID and password, then ask for the departure and destination locations.
Generally, you need to first search for flights that meet the criteria, and then proceed with the booking.
Round-trip Flights: Booking a round-trip flight requires booking two separate flights, one for the outbound and one for the return.
Connecting Flights: If there are no direct flights that meet the criteria, consider connecting flights, which require providing a layover city. After finding suitable connecting flights, book the two flight segments. At this point, you can use parallel calls to book both segments simultaneously, in the format [ApiName(key1='value1', ...), ApiName(key1='value1', ...)].
Payment: Payment methods include cash and bank. You need to ask the user for their payment method.
Checked Baggage: If the booking user is a regular member, economy class passengers are entitled to 1 free checked bag, and business class passengers are entitled to 2 free checked bags. Silver members receive 2 free bags for economy and 3 for business class. Gold members receive 3 free bags for both economy and business class. Each additional bag costs 50 yuan.

Modifying Flights
The agent must first obtain the user ID and password. Reservation information can be retrieved using the user ID.
Changing Flights: The flight number to be changed can be determined by querying existing flight information and combining it with the user's requirements. Reservations can be modified without changing the departure or destination locations. Some flight segments can be retained, but their prices will not be updated based on current prices. The API does not automatically check these rules, so the agent must ensure the rules apply before calling the API.
Changing Cabin: All reservations (including basic economy) can change cabins without changing flights. Changing cabins requires the user to pay the difference between the current cabin and the new cabin. All flight cabins in the same reservation must be consistent; you cannot change the cabin for only a specific segment.
Changing Baggage: Users can add checked baggage but cannot reduce it.
Payment: If the flight is changed, the agent should ask about the payment or refund method.

Canceling Flights
The agent must first obtain the user ID, reservation ID, and reason for cancellation (change of plans, airline cancellation, or other reasons).
All reservations can be canceled within 24 hours of booking or if the airline cancels the flight. Otherwise, canceling an economy class flight within 24 hours of booking incurs a 20% fee of the ticket price as a handling fee, while business class flights can always be canceled. This rule is not affected by membership level.
The agent can only cancel entire itineraries that have not yet flown. If any segment has been used, assistance cannot be provided and the user must be transferred to a human agent.
Refunds are automatically credited to the user's credit card account.

Refunds
If the user is a Silver/Gold member or traveling in business class, and files a complaint due to flight cancellation, a voucher of 200 yuan per passenger can be provided as compensation after verification.
If the user is a Silver/Gold member or traveling in business class, and files a complaint due to flight delay and wishes to change or cancel the reservation, a voucher of 100 yuan per passenger can be provided as compensation after verification and changing or canceling the reservation.
Unless the user explicitly complains and requests compensation, do not proactively offer these compensations.

Function Calls:
When a function call is needed, please strictly adhere to the above format requirements: [ApiName(key1='value1', key2='value2', ...)]

When you believe the current task is completed, return "finish conversation" to end the dialogue."""

BASE_PROMPT_EN = """The current time is June 11, 2024, 16:00 (Beijing Time). As a simulated mobile assistant agent, you can help users send text messages, add reminders, and order takeout.

You should not provide information, knowledge, or procedures that are not provided by the user or available tools, nor should you offer subjective advice or comments.
Only one tool can be called at a time, but parallel calls of the same tool are allowed. Do not reply to the user while calling a tool, and do not call a tool while replying to the user.
You should refuse any user requests that violate this policy.
When the user provides incomplete information or when execution content results in an error, you can ask the user for more complete information.
Names mentioned by the user are the user's full names.

Sending Text Messages:
Before sending a text message, the agent must first obtain the sender and recipient of the message.
When the memory is full and needs to delete messages, you need to ask the user: "Memory is full, which message would you like to delete?"

Viewing Text Messages:
Before viewing text messages, the agent must first log into the device via login_device().
Before viewing text messages, the agent must first obtain the sender and recipient of the messages.
After viewing text messages, the agent needs to ask the user if they want to add the message content to a reminder.
After viewing text messages, the agent needs to ask the user if they want to reply to the message.
If the message content involves takeout, the agent needs to ask if the user wants to order takeout based on the message content.

Adding Reminders:
Before adding a reminder, you should obtain the content and title of the reminder. The reminder time defaults to the current time.
If the reminder to be added is the content of a specific message, the agent needs to first view the message content.

Viewing Specific Reminders by Title:
After viewing a specific reminder by title, you need to ask the user if they want to complete the tasks within it.

Ordering Takeout:
Before ordering takeout, the agent needs to obtain the user's takeout platform account and password, and log in using login_food_platform().
If the merchant, product, and quantity for the order are not initially provided, you need to ask the user.
When encountering takeout from different merchants, you need to order them one by one.
If the balance is insufficient, you need to inform the user "Insufficient balance" and ask if they want to change the order.

Function Calls:
When a function call is needed, please strictly adhere to the above format requirements: [ApiName(key1='value1', key2='value2', ...)], Please remember that the function call must start with [ and end with ]!!!!!!
You need to promptly feedback the task execution status to the user and do not repeatedly call the same function. When you believe the current task is completed, respond with "finish conversation" to end the dialogue."""

USER_SYSTEM_TRAVEL_EN = """You are a user interacting with an agent.

Instruction: {instruction}

Rules:
- Generate only one line of content each time to simulate the user's message.
- Do not reveal all instruction content at once. Only provide information needed for the current step.
- Do not speculate information not provided in the instructions. For example, if the agent asks for an order ID but it is not mentioned in the instructions, do not fabricate an order ID; instead, directly state that you do not remember or do not have it.
- When information confirmation is needed, decide whether to confirm based on the content in the Instruction.
- Do not repeat instruction content in the conversation; instead, express the same information in your own words.
- Keep the dialogue natural and maintain the user's personality as described in the instructions.
- If the goal in the instructions has been achieved, generate a separate line with the message 'finish conversation' to end the dialogue.
- If the Instruction requires booking a round-trip flight, you need to state the intention "Book a round-trip flight" at the very beginning.
"""

USER_SYSTEM_BASE_EN = """You are a user interacting with an agent.

Instruction: {instruction}

Rules:
- Generate only one line of content each time to simulate the user's message.
- Do not reveal all instruction content at once. Only provide information needed for the current step.
- Ensure that all information needed for the current step is provided completely. For example, when adding a reminder, you need to provide the reminder's description, title, and time, etc.
- Do not speculate information not provided in the instructions. For example, if the Instruction does not directly specify takeout content, do not fabricate takeout content.
- When asked if you need further assistance, make sure whether all main tasks in the Instruction have been completed. If not, continue to provide the next step task to the agent.
- Names appearing in the Instruction are assumed to be the user's full names.
- When the agent asks which message to delete, follow the Instruction's requirements to delete the message.
- You cannot proactively offer help to the agent. Respond to the agent's questions as per the Instruction's requirements, and do not fabricate any information you do not know.
- If all tasks are completed, generate a separate line with the message 'finish conversation' to end the dialogue.
"""

# ---------------------------------------------------------------------------------------------
# One item's dialogue: who answers a reply, what ran, when it ends.


@dataclasses.dataclass(frozen=True)
class Reference:
    category: str
    question: str
    functions: list
    involved_classes: list
    initial_config: dict
    ground_truth: list
    milestones: list  # reply strings, or alternative lists of them


def first_observation(ref: Reference, opening: str) -> str:
    """Upstream's agent prompt for the first turn: instructions, functions, ``user:`` and the
    task (multi_step) or the simulated user's opening line (multi_turn)."""
    history = f"user:{opening}\n"
    if ref.category == "agent_multi_step":
        return MULTI_STEP_AGENT_SYSTEM_EN + "\n" + MULTI_STEP_AGENT_USER_EN.format(functions=ref.functions,
                                                                                  history=history)
    system = MULTI_TURN_AGENT_SYSTEM_EN
    if "Travel" in ref.involved_classes:
        system += TRAVEL_PROMPT_EN
    if "BaseApi" in ref.involved_classes:
        system += BASE_PROMPT_EN
    return system + "\n" + MULTI_TURN_AGENT_USER_EN.format(functions=ref.functions, history=history)


def user_chat(ref: Reference) -> list[dict]:
    """The simulated user's chat before its opening line (upstream's ``get_init_prompt``)."""
    prompt = USER_SYSTEM_BASE_EN if "BaseApi" in ref.involved_classes else USER_SYSTEM_TRAVEL_EN
    return [{"role": "system", "content": prompt.format(instruction=ref.question)},
            {"role": "user", "content": USER_OPENING_EN}]


def decode(reply: str) -> list[dict]:
    """The calls of a reply, read as upstream's ``decode_function_list`` reads it: the whole
    reply, brackets added where missing, at least one call. Raises `acebench.ParseError`."""
    text = reply.strip()
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    calls = acebench.parse_calls(text)
    if not calls:
        raise acebench.ParseError("no call")
    return calls


def shown(result) -> object:
    """A call's result as upstream passes it on: as JSON text (dicts) or ``str``, read back as
    JSON where that parses."""
    if isinstance(result, str):
        text = result
    elif isinstance(result, dict):
        try:
            text = json.dumps(result)
        except (TypeError, ValueError):
            text = str(result)
    else:
        text = str(result)
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclasses.dataclass
class Turn:
    """What follows a message: ``respond`` (``observation`` is the next one), ``ask_user``
    (multi_turn: the simulated user answers), ``finish`` or ``limit`` (the episode ends)."""

    kind: str
    observation: str = ""


class Dialogue:
    """Upstream's scene for one item, counted in its dialogue messages. The API state depends only
    on the agent's replies, so scoring replays them through a new Dialogue."""

    def __init__(self, ref: Reference):
        self.ref = ref
        self.scenario = Scenario(ref.involved_classes, ref.initial_config)
        self.messages = 0
        self.executed: list[str] = []  # the replies sent to execution: upstream's process

    def agent(self, reply: str) -> Turn:
        position = self._add()
        if position > 1 and FINISH in reply:
            return Turn("finish")
        if self.messages >= MAX_DIALOG_MESSAGES:
            return Turn("limit")
        multi_step = self.ref.category == "agent_multi_step"
        try:
            calls = decode(reply) if multi_step or re.search(r"\[.*\]", reply) else None
        except acebench.ParseError:
            calls = None
        if calls is None and not multi_step:
            return Turn("ask_user")
        self.executed.append(reply)
        if calls is None:
            observation = f"execution result:{NUDGE}"
        else:
            results = [shown(result) for result in self.scenario.run(calls)]
            observation = f"{'execution result' if multi_step else 'execution'}:{results}"
        self._add()
        return Turn("limit" if self.messages >= MAX_DIALOG_MESSAGES else "respond", observation)

    def user(self, line: str) -> Turn:
        position = self._add()
        if position > 1 and FINISH in line:
            return Turn("finish")
        return Turn("limit" if self.messages >= MAX_DIALOG_MESSAGES else "respond", f"user:{line}")

    def _add(self) -> int:
        self.messages += 1
        return self.messages - 1


def replay(ref: Reference, replies: Sequence[str]) -> Dialogue:
    """A new Dialogue that has seen ``replies`` (the user's lines do not change the APIs' state)."""
    dialogue = Dialogue(ref)
    for reply in replies:
        turn = dialogue.agent(reply)
        if turn.kind == "ask_user":
            turn = dialogue.user("")
        if turn.kind in ("finish", "limit"):
            break
    return dialogue


def reference_replies(ref: Reference) -> list[str]:
    """The answer's (first) milestone replies and ``finish conversation`` (tests, checks)."""
    milestones = ref.milestones[0] if ref.milestones and isinstance(ref.milestones[0], list) else ref.milestones
    return list(milestones) + [FINISH]


# ---------------------------------------------------------------------------------------------
# Scoring: upstream's agent_eval (end state), agent_checker and agent_eval_process.


def judge(ref: Reference, state: list[dict], executed: Sequence[str]) -> dict:
    """End state (``end_state``, ``diff``, ``unchecked`` answer classes) and process accuracy."""
    diff, unchecked = end_state_diff(ref.ground_truth, state)
    end_state = not diff
    return {"end_state": end_state, "process_accuracy": 1.0 if end_state else process_accuracy(ref.milestones, executed),
            "diff": diff, "unchecked": unchecked}


def end_state_diff(ground_truth, state: list[dict]) -> tuple[list[str], list[str]]:
    """What differs (empty: the end state matches) and the answer classes no class of the state
    has the name of (not checked, as upstream)."""
    answer = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    if len(answer) != len(state):
        return [f"wrong number of classes: the end state has {len(state)}, the answer {len(answer)}"], []
    diff, unchecked = [], []
    for expected in answer:
        got = next((s for s in state if set(s) == set(expected)), None)
        if got is None:
            unchecked.append(next(iter(expected), ""))
            continue
        diff.extend(_class_diff(expected, got))
    return diff, unchecked


def _class_diff(expected: dict, got: dict) -> list[str]:
    name, want = next(iter(expected.items()))
    have = next(iter(got.values()))
    diff = []
    for attribute, value in have.items():
        if attribute not in want:
            diff.append(f"{name}.{attribute} is not in the answer")
        elif isinstance(want[attribute], dict):
            for key, wanted in want[attribute].items():
                if not isinstance(value, dict) or key not in value:
                    diff.append(f"{name}.{attribute}[{key!r}] missing, expected {wanted}")
                elif value[key] != wanted:
                    diff.append(f"{name}.{attribute}[{key!r}] is {value[key]}, expected {wanted}")
        elif want[attribute] != value:
            diff.append(f"{name}.{attribute} is {value}, expected {want[attribute]}")
    return diff


def process_accuracy(milestones: list, executed: Sequence[str]) -> float:
    """The fraction of milestone replies found in order among ``executed`` (the best alternative)."""
    alternatives = milestones if milestones and isinstance(milestones[0], list) else [milestones]
    best = 0.0
    for stones in alternatives:
        if not stones:
            return 1.0
        found, position = 0, 0
        for stone in stones:
            while position < len(executed):
                position += 1
                if executed[position - 1].strip() == stone.strip():
                    found += 1
                    break
        best = max(best, found / len(stones))
    return best


# ---------------------------------------------------------------------------------------------
# The episodes: an in-process pool with the sandbox pool's calls.

SimulatedUser = Callable[[list[list[dict]]], list[str]]


class PolicyUser:
    """The evaluated policy as upstream's simulated user: greedy, one batch per call, each call's
    seed derived from the run's seed and the call's number. Each line's budget is fitted to the
    room its chat leaves in the model (`bounded.reply_budgets`); a chat with no room gets None."""

    def __init__(self, policy, max_new_tokens: int, seed: int):
        self.policy, self.max_new_tokens, self.seed, self.calls = policy, max_new_tokens, seed, 0

    def __call__(self, chats: list[list[dict]]) -> list[str | None]:
        from spade_jax.sampling import chat as sampling_chat

        seed = derive_seed(self.seed, "acebench-agent/user", self.calls)
        self.calls += 1
        tokenizer = self.policy.tokenizer
        chats = [[dict(m, content=prompt_text(tokenizer, m["content"])) for m in chat] for chat in chats]
        lengths = [len(tokenizer.apply_chat_template(chat, add_generation_prompt=True)) for chat in chats]
        budgets = bounded.reply_budgets(lengths, self.max_new_tokens, self.policy.config.max_position_embeddings)
        fits = [i for i, budget in enumerate(budgets) if budget > 0]
        completions = sampling_chat.complete_chats(
            self.policy, [chats[i] for i in fits], max_new_tokens=self.max_new_tokens,
            limits=[budgets[i] for i in fits], temperature=0.0, seed=seed) if fits else []
        lines: list[str | None] = [None] * len(chats)
        for i, completion in zip(fits, completions):
            lines[i] = completion.text.strip()
        return lines


class EndpointUser:
    """An OpenAI-compatible server's model as upstream's simulated user: greedy chat completions
    (`max_new_tokens` each, seeded as `PolicyUser`), the chats of one call sent concurrently. The
    model is the server's first (``GET /models``) unless named. A chat the server refuses as too
    long for its context gets None (that episode ends, its user out of room); any other failure
    stops the evaluation with the server's message."""

    MAX_CONCURRENT = 8

    def __init__(self, endpoint: str, max_new_tokens: int, seed: int, model: str = "", timeout_s: float = 300.0):
        if not re.match(r"https?://[^/\s]+", endpoint):
            raise ValueError(f"eval.user_endpoint must be an http(s) URL, got {endpoint!r}")
        self.endpoint, self.max_new_tokens, self.seed, self.timeout_s = endpoint.rstrip("/"), max_new_tokens, seed, timeout_s
        self.calls = 0
        self.model = model or self._request("GET", "/models")["data"][0]["id"]

    @property
    def name(self) -> str:
        return f"{self.model} at {self.endpoint}"

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.endpoint + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            detail = err.read()[:2000].decode(errors="replace")
            raise _EndpointError(err.code, f"simulated user at {self.endpoint}{path}: HTTP {err.code}: {detail}") from None
        except (OSError, ValueError) as err:
            raise RuntimeError(f"simulated user at {self.endpoint}{path}: {err}") from None

    def _line(self, chat: list[dict], seed: int) -> str | None:
        body = {"model": self.model, "messages": chat, "max_tokens": self.max_new_tokens, "temperature": 0.0,
                "seed": seed}
        try:
            reply = self._request("POST", "/chat/completions", body)
        except _EndpointError as err:
            if err.status == 400 and "context" in str(err):
                return None
            raise RuntimeError(str(err)) from None
        content = reply["choices"][0]["message"].get("content")
        return (content or "").strip()

    def __call__(self, chats: list[list[dict]]) -> list[str | None]:
        seed = derive_seed(self.seed, "acebench-agent/user", self.calls) % 2**63
        self.calls += 1
        if not chats:
            return []
        with concurrent.futures.ThreadPoolExecutor(min(self.MAX_CONCURRENT, len(chats))) as pool:
            return list(pool.map(lambda chat: self._line(chat, seed), chats))


class _EndpointError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


POLICY_USER = "the evaluated policy"


@dataclasses.dataclass
class _Episode:
    ref: Reference
    dialogue: Dialogue
    chat: list[dict]  # the simulated user's
    budget: bounded.WorkBudget
    turn: int = 0


NO_ROOM_FOR_USER = "the simulated user's chat no longer fits the model"


class AgentPool(InProcessPool):
    """Plays items (``spec.program`` is the item id) on simulated APIs in this process; ``user``
    answers the multi_turn replies that are not calls (None: multi_turn episodes fail to start;
    a None line: that episode ends, its user out of room). Each episode's executions are bounded
    by a `bounded.WorkBudget` of ``work_s`` seconds."""

    def __init__(self, references: dict[str, Reference], user: SimulatedUser | None,
                 work_s: float = bounded.ITEM_WORK_S):
        self.references, self.user, self.work_s = references, user, work_s
        super().__init__()

    def start(self, specs) -> list[StepResult]:
        results: list[StepResult | None] = []
        openings = []  # (index in results, episode id) of multi_turn episodes: the user speaks first
        for spec in specs:
            episode_id = self._new_id()
            ref = self.references.get(spec.program)
            if ref is None:
                results.append(StepResult(episode_id, truncated=True, failed_call="load",
                                          error=f"no ACEBench agent item {spec.program[:80]!r}"))
            elif ref.category == "agent_multi_turn" and self.user is None:
                results.append(StepResult(episode_id, truncated=True, failed_call="load",
                                          error="agent_multi_turn needs a simulated user"))
            else:
                self._episodes[episode_id] = _Episode(ref, Dialogue(ref), user_chat(ref), bounded.WorkBudget(self.work_s))
                if ref.category == "agent_multi_turn":
                    openings.append((len(results), episode_id))
                    results.append(None)
                else:
                    results.append(StepResult(episode_id, observation=first_observation(ref, ref.question)))
        if openings:
            lines = self.user([self._episodes[episode_id].chat for _, episode_id in openings])
            for (index, episode_id), line in zip(openings, lines):
                episode = self._episodes[episode_id]
                if line is None:
                    results[index] = StepResult(episode_id, truncated=True, failed_call="load", error=NO_ROOM_FOR_USER)
                    continue
                episode.chat.append({"role": "assistant", "content": line})
                results[index] = StepResult(episode_id, observation=first_observation(episode.ref, line))
        return results

    def step(self, episode_ids, actions) -> list[StepResult]:
        results: dict[int, StepResult] = {}
        asking = []
        for episode_id, action in zip(episode_ids, actions):
            episode = self._episodes[episode_id]
            episode.turn += 1
            if episode.budget.exhausted:
                results[episode_id] = self._stopped(episode_id, episode.budget.reason)
                continue
            with episode.budget.charge():
                turn = episode.dialogue.agent(action)
            if episode.budget.exhausted:
                results[episode_id] = self._stopped(episode_id, episode.budget.reason)
            elif turn.kind == "ask_user":
                episode.chat.append({"role": "user", "content": re.sub(r"^(user:|agent:)", "", action)})
                asking.append(episode_id)
            else:
                results[episode_id] = self._result(episode_id, turn)
        if asking:
            for episode_id, line in zip(asking, self.user([self._episodes[i].chat for i in asking])):
                episode = self._episodes[episode_id]
                if line is None:
                    results[episode_id] = self._stopped(episode_id, NO_ROOM_FOR_USER)
                    continue
                episode.chat.append({"role": "assistant", "content": line})
                results[episode_id] = self._result(episode_id, episode.dialogue.user(line))
        return [results[episode_id] for episode_id in episode_ids]

    def _stopped(self, episode_id: int, reason: str) -> StepResult:
        return StepResult(episode_id, truncated=True, failed_call="limit", error=reason,
                          turn=self._episodes[episode_id].turn)

    def _result(self, episode_id: int, turn: Turn) -> StepResult:
        episode = self._episodes[episode_id]
        if turn.kind == "finish":
            dialogue = episode.dialogue
            reward = 1.0 if judge(episode.ref, dialogue.scenario.state(), dialogue.executed)["end_state"] else 0.0
            return StepResult(episode_id, observation="The conversation is over.", reward=reward, raw_reward=reward,
                              terminated=True, turn=episode.turn)
        return StepResult(episode_id, observation=turn.observation, truncated=turn.kind == "limit", turn=episode.turn)



# ---------------------------------------------------------------------------------------------
# The suite.


@dataclasses.dataclass
class ACEBenchAgentSuite:
    directory: Path
    settings: GenerationSettings
    references: dict  # item id -> Reference, category by category in file order
    notes: list = dataclasses.field(default_factory=list)
    name: str = "acebench-agent"
    work_s: float = bounded.ITEM_WORK_S  # seconds of execution one item's calls may take
    endpoint_user: EndpointUser | None = None  # the simulated user, when not the evaluated policy
    system_prompt = BENCHMARK_SYSTEM_PROMPT  # upstream's agent prompt opens the first user message

    @property
    def user_name(self) -> str:
        return self.endpoint_user.name if self.endpoint_user else POLICY_USER

    def all_items(self) -> list[Item]:
        return [Item(item_id, group=ref.category, program=item_id, max_turns=MAX_DIALOG_MESSAGES // 2, reference=ref)
                for item_id, ref in self.references.items()]

    def items(self, limit: int | None, seed: int) -> list[Item]:
        """All items, or ``limit`` of them spread over the two categories (`suite.spread`)."""
        items = self.all_items()
        return [items[i] for i in spread([item.group for item in items], limit, seed, self.name)]

    @staticmethod
    def read_action(reply: str) -> str:
        """The pool reads the whole reply as upstream does (not the agent's parsed action)."""
        return reply

    def episode_pool(self, context: Context) -> AgentPool:
        user = self.endpoint_user or (
            PolicyUser(context.policy, self.settings.max_new_tokens, context.seed) if context.policy else None)
        return AgentPool(self.references, user, self.work_s)

    def score(self, item: Item, trajectory, context: Context | None = None) -> Score:
        """Replays exactly what the pool executed: every reply as `read_action` handed it over
        (the whole reply), through a new Dialogue (the API state depends only on those)."""
        ref: Reference = item.reference
        error = getattr(trajectory, "error", None)
        if error and error.startswith(bounded.BUDGET_EXCEEDED):
            return Score(0.0, False, {"end_state": False, "process_accuracy": 0.0, "category": ref.category,
                                      "error": error, "turns": trajectory.turns, "end": trajectory.end_reason})
        replies = [self.read_action(m["content"]) for m in trajectory.messages if m["role"] == "assistant"]
        dialogue = replay(ref, replies)
        verdict = judge(ref, dialogue.scenario.state(), dialogue.executed)
        details = dict(verdict, category=ref.category, executed=dialogue.executed, turns=trajectory.turns,
                       end=trajectory.end_reason)
        if ref.category == "agent_multi_turn":
            details["user"] = self.user_name
        if error:
            details["error"] = error
        return Score(1.0 if verdict["end_state"] else 0.0, verdict["end_state"], details)


def load(directory: Path) -> tuple[dict, list[str]]:
    references, notes = {}, []
    unchecked = 0
    for category in CATEGORIES:
        data, answers = directory / f"data_{category}.json", directory / "possible_answer" / f"data_{category}.json"
        if not data.is_file() or not answers.is_file():
            notes.append(f"{category}: no {data.name} or possible_answer/{answers.name}; left out")
            continue
        try:
            truth = {str(a["id"]): a for a in _read_jsonl(answers)}
            rows = _read_jsonl(data)
            for row in rows:
                answer = truth.get(str(row["id"]))
                if answer is None or any(name not in CLASSES for name in row["involved_classes"]):
                    notes.append(f"{row['id']}: no possible answer or an unknown API class; left out")
                    continue
                ref = Reference(category, row["question"], row["function"], row["involved_classes"],
                                row.get("initial_config") or {}, answer["ground_truth"], answer.get("mile_stone") or [])
                unchecked += any(next(iter(c), "") not in CLASSES for c in _as_list(ref.ground_truth))
                references[str(row["id"])] = ref
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise SuiteUnavailable(f"{data} or its possible answers are not ACEBench agent JSON lines: {err!r}") from None
    notes.append(f"end state as upstream checks it: {unchecked} items name an answer class that is no API class "
                 "(ReminderAPI, ...), which is not checked; dict attributes are compared on the answer's keys only")
    notes.append("details.process_accuracy: upstream's process accuracy (milestone replies in order, 1 when the "
                 "end state matches)")
    return references, notes


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@register("acebench-agent", GenerationSettings(temperature=0.0, max_new_tokens=512),
          summary="ACEBench agent categories (multi_step, multi_turn) as episodes on simulated APIs, "
                  "scored by end state and milestones as upstream does")
def make(argument: str, settings: GenerationSettings, eval_config) -> ACEBenchAgentSuite:
    """ACEBench agent categories (multi_step, multi_turn) as episodes on simulated APIs."""
    directory = acebench.data_dir(argument, eval_config, "acebench-agent")
    references, notes = load(directory)
    if not references:
        raise SuiteUnavailable(f"{directory}: no agent category with its possible answers; "
                               f"{acebench.WHERE.format(prefix='acebench-agent')}")
    endpoint = getattr(eval_config, "user_endpoint", "")
    user = EndpointUser(endpoint, settings.max_new_tokens, eval_config.seed) if endpoint else None
    if user:
        notes.insert(0, f"agent_multi_turn: the simulated user is {user.name} (upstream: gpt-4o)")
    else:
        notes.insert(0, "agent_multi_turn: the simulated user is the evaluated policy itself (upstream: gpt-4o), so "
                        "its scores are not comparable to published numbers; eval.user_endpoint names another")
    return ACEBenchAgentSuite(directory, settings, references, notes, endpoint_user=user)
