"""ACEBench (`acebench[:DIR]`): the normal and special categories, scored as upstream scores them.

ACEBench (chenchen0103/ACEBench, MIT) asks for tool calls in one reply. DIR is the English data
folder of the repository (``data_all/data_en``: ``data_<category>.json`` with one JSON object
per line, and ``possible_answer/data_<category>.json`` with the ground truth under the same
ids) or a clone of the repository; without DIR, ``config.eval.acebench_dir``. Nothing is
downloaded.

Items: one chat per line of data: upstream's system prompt (normal, preference or special)
with the function list written as upstream writes it (``str`` of the list) and the
conversation as the user turn. Group: the category (``normal_atom_bool``,
``special_incomplete``, ...). The agent categories (``agent_multi_turn``,
``agent_multi_step``) need upstream's simulated APIs and user and are not included.

Scoring follows upstream's ``eval_main.py`` and ``model_eval/checker.py`` rule for rule:

* normal: the reply's first outermost ``[...]`` (the whole reply, whitespace outside strings
  removed, for the multi-turn categories) is parsed as a Python list of calls ``[Name(key=value, ...)]``;
  the calls must match one of the possible answers: the same function names as often as the
  answer has them (``name_1``, ``name_2`` in an answer are two calls of ``name``), every
  required parameter, no parameter that is not in the answer, types as the schema says, and
  the values: strings when the answer, lower-cased with `` ,./-_*^`` removed, is contained in
  the reply's; lists equal element by element (strings so normalised); objects key by key
  (leaves compared as the answer's text contained in the reply's). Upstream never compares
  integer, number or boolean values (nor any value whose type differs from the schema's),
  only their types; ``details["scalars_match"]`` says whether those match too.
* special: the raw reply must say ``Missing necessary parameters`` and name the function and
  every missing parameter (incomplete), ``There is incorrect value`` and every wrong value
  (error_param), or ``the limitations of the function`` (irrelevant).

Where upstream rejects a reply that is exactly a possible answer, this checker does not; its
verdicts differ from upstream's only there (29 of the 973 English items; compared with
upstream's own checker on eleven thousand replies made from the answers and variations):

1. multi-turn: upstream removes all whitespace, also inside strings, so a string with a space
   in a list inside an object (``{'interests': ['cultural tourism']}``) never matches (27
   items); here whitespace inside quotes is kept;
2. an empty list in the answer (``event_details=[]``) fails upstream's nested type check
   whatever the reply (1 item); here ``[]`` matches it;
3. an array parameter whose schema gives no item type is taken by upstream for a list of
   objects, which rejects the answer's list of strings (1 item); here such a list is compared
   as a plain list.

Upstream's headline for the two ``normal_multi_turn`` categories counts a conversation right
only when all its turns are; here every turn is an item (``details["conversation"]`` names
its conversation), so their group scores are per turn. Upstream evaluates BinOp arguments
with ``eval``; here only arithmetic on literals is evaluated (and ``+x`` is ``x``, where
upstream negates every unary operand), and what it builds is bounded: a computed value has at
most 10,000 elements and characters, a reply's calls `bounded.MAX_LITERAL_SIZE` in all, lists
written out (``[[0]*10**4]*10**4`` is 10^8, though it shares one inner list); a reply past
either does not parse.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import operator
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from spade_jax.evals import bounded
from spade_jax.evals.registry import register
from spade_jax.jsonable import jsonable
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread

NORMAL_CATEGORIES = (
    "normal_single_turn_single_function",
    "normal_single_turn_parallel_function",
    "normal_multi_turn_user_adjust",
    "normal_multi_turn_user_switch",
    "normal_similar_api",
    "normal_preference",
    "normal_atom_bool",
    "normal_atom_enum",
    "normal_atom_number",
    "normal_atom_list",
    "normal_atom_object_deep",
    "normal_atom_object_short",
)
SPECIAL_CATEGORIES = ("special_incomplete", "special_error_param", "special_irrelevant")
CATEGORIES = NORMAL_CATEGORIES + SPECIAL_CATEGORIES
AGENT_CATEGORIES = ("agent_multi_turn", "agent_multi_step")

WHERE = ("ACEBench data not found: clone https://github.com/chenchen0103/ACEBench (MIT) and give its "
         "data_all/data_en folder as --suites={prefix}:DIR or --config.eval.acebench_dir=DIR")

# ---------------------------------------------------------------------------------------------
# Prompts: upstream's model_inference/prompt_en.py, verbatim.

SYSTEM_PROMPT_FOR_NORMAL_DATA_EN = """You are an AI assistant with the role name "assistant." Based on the provided API specifications and conversation history from steps 1 to t, generate the API requests that the assistant should call in step t+1. The API requests should be output in the format [ApiName(key1='value1', key2='value2', ...)], replacing ApiName with the actual API name, key1, key2, etc., with the actual parameter names, and value1, value2, etc., with the actual parameter values. The output should start with a square bracket "[" and end with a square bracket "]".
If there are multiple API requests, separate them with commas, for example: [ApiName(key1='value1', key2='value2', ...), ApiName(key1='value1', key2='value2', ...), ...]. Do not include any other explanations, prompts, or API call results in the output.
If the API parameter description does not specify otherwise, the parameter is optional (parameters mentioned in the user input need to be included in the output; if not mentioned, they do not need to be included).
If the API parameter description does not specify the required format for the value, use the user's original text for the parameter value.
If the API requires no parameters, output the API request directly in the format [ApiName()], and do not invent any nonexistent parameter names.

{time}

Role Descriptions:
user: User
assistant: The AI assistant role that makes API requests
tool: Provides the results returned from tool calls

API Specifications:
{function}"""

SYSTEM_PROMPT_FOR_PREFERENCE_DATA_EN = """You are an AI assistant, and your role is called assistant. Based on the given API description, dialogue history 1..t, and character profile, generate the API requests that the assistant should call in step t+1. The API requests should be output in the format [ApiName(key1='value1', key2='value2', ...)], where ApiName is replaced with the actual API name, and key1, key2, etc., are replaced with the actual parameter names, and value1, value2 are replaced with the actual parameter values. The output should start with a "[" and end with a "]".
If there are multiple API requests, they should be separated by commas, e.g., [ApiName(key1='value1', key2='value2', ...), ApiName(key1='value1', key2='value2', ...), ...]. Do not output any other explanations, hints, or results of the API calls in the output.
If the API parameter description does not specify special instructions, the parameter is optional (parameters mentioned in the user input or character profile should be included in the output, and if not mentioned, they should not be included).
If the API parameter description does not specify the format for the parameter value, the parameter value should be taken from the user's original text or character profile.
If the API requires no parameters, the API request should be output as [ApiName()], with no fabricated parameter names.

Character Profile:
{profile}

Role Description:
user: User
assistant: AI assistant performing API calls
tool: Provides the results of tool calls

API Description:
{function}"""

SYSTEM_PROMPT_FOR_SPECIAL_DATA_EN = """You are an AI assistant with the role name "assistant". Based on the provided API specifications and conversation history from steps 1 to t, generate the API requests that the assistant should call in step t+1. Below are two specific scenarios:
1. When the information provided by the user is clear and unambiguous, and the problem can be resolved using the list of candidate functions:
   - If the API parameter description does not specify the required format for the value, use the user's original text for the parameter value.
   - When multiple tools in the candidate list can satisfy the user's needs, output all API requests.
   - API requests should be output in the format [ApiName(key1='value1', key2='value2', ...), ApiName(key1='value1', key2='value2', ...), ...], replacing ApiName with the actual API name, key1, key2, etc., with the actual parameter names, and value1, value2, etc., with the actual parameter values. The output should start with a square bracket "[" and end with a square bracket "]". At this time, the output must not contain any other content.

2. When the information provided by the user is unclear, incomplete, or incorrect, or the user's question exceeds the capabilities of the provided functions, you need to clearly point out these issues. The following is your strategy:
   (1) If the user's instructions include the key details required to call the API, but the type or form of the parameter values does not match the API's definitions, ask in-depth questions to clarify and correct the details. The output format should be: ["There is incorrect value (value) for the parameters (key) in the conversation history."]
   (2) If the user's instructions lack the key details required by the API, ask questions to obtain the necessary information. The output format should be: ["Missing necessary parameters (key1, key2, ...) for the api (ApiName)"], replacing key1, key2 with the names of the missing parameters and ApiName with the actual API name.
   (3) If the user's request exceeds the current capabilities of your APIs, inform them that you cannot fulfill the request. The output format should be: ["Due to the limitations of the function, I cannot solve this problem."]
   Note: The above steps have a priority order. You need to first determine whether scenario (1) applies. If it does, output according to the requirements in (1). Pay attention to distinguishing between scenarios (1) and (2).

{time}

Role Descriptions:
user: User
assistant: The AI assistant role that makes API requests

API Specifications:
{function}"""

USER_PROMPT_EN = """Conversation history 1..t:\n{question}"""


def build_messages(category: str, row: dict) -> tuple[dict, ...]:
    """The chat upstream sends for one data line (``single_turn_inference``, English)."""
    functions = row["function"]
    if isinstance(functions, (dict, str)):
        functions = [functions]
    if category.startswith("special"):
        system = SYSTEM_PROMPT_FOR_SPECIAL_DATA_EN.format(time=row.get("time", ""), function=functions)
    elif "preference" in category:
        system = SYSTEM_PROMPT_FOR_PREFERENCE_DATA_EN.format(profile=row.get("profile", ""), function=functions)
    else:
        system = SYSTEM_PROMPT_FOR_NORMAL_DATA_EN.format(time=row.get("time", ""), function=functions)
    return ({"role": "system", "content": system},
            {"role": "user", "content": USER_PROMPT_EN.format(question=row["question"])})


# ---------------------------------------------------------------------------------------------
# Reading a reply: upstream's extract_outermost_bracket_content and decode_ast (ast_parse).


class ParseError(ValueError):
    pass


def outermost_brackets(text: str) -> str | None:
    """The first balanced ``[...]`` of ``text`` (None when there is none)."""
    start, depth = -1, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth == 0:
                start = i
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0 and start != -1:
                return text[start:i + 1]
    return None


def without_whitespace(text: str) -> str:
    """``text`` with its whitespace removed except inside quoted strings. Upstream removes all of
    it (``"".join(text.split())``), which changes string values: ``['historical sites']`` nested in
    an object then never matches the possible answer, whose strings keep their spaces."""
    out, quote, escaped = [], None, False
    for char in text:
        if quote is not None:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char.isspace():
            continue
        else:
            out.append(char)
            if char in "'\"":
                quote = char
    return "".join(out)


def parse_calls(text: str | None) -> list[dict]:
    """``[f(a=1), g.h(b='x')]`` -> ``[{'f': {'a': 1}}, {'g.h': {'b': 'x'}}]`` (positional arguments
    are dropped, as upstream drops them). Raises ParseError for anything else, and for calls
    whose arguments are larger than `bounded.MAX_LITERAL_SIZE` written out."""
    if text is None:
        raise ParseError("no [...] in the reply")
    try:
        with warnings.catch_warnings():  # invalid escapes in the reply's strings
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise ParseError(f"not a Python list of calls: {type(err).__name__}: {err}") from None
    if not isinstance(tree.body, (ast.List, ast.Tuple, ast.Set)):
        raise ParseError("not a list of calls")
    calls = []
    try:
        for element in tree.body.elts:
            if not isinstance(element, ast.Call):
                raise ParseError(f"list element is not a call: {_unparse(element)[:80]}")
            calls.append(_call(element))
        if bounded.literal_size(calls) > bounded.MAX_LITERAL_SIZE:
            raise ParseError(f"arguments too large: over {bounded.MAX_LITERAL_SIZE} elements and characters in all")
    except RecursionError:
        raise ParseError("nested too deeply") from None
    return calls


def _unparse(node) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - only used in messages
        return type(node).__name__


def _dotted_name(func) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _call(node: ast.Call) -> dict:
    return {_dotted_name(node.func): {kw.arg: _value(kw.value) for kw in node.keywords}}


def _value(node) -> Any:
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        return _arithmetic(node)
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ParseError("** in a dict")
        out = {}
        for k, v in zip(node.keys, node.values):
            key = _value(k)
            try:
                out[key] = _value(v)
            except TypeError:  # an unhashable key
                raise ParseError(f"unhashable dict key: {_unparse(k)[:80]}") from None
        return out
    if isinstance(node, ast.BinOp):
        return _arithmetic(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return {_dotted_name(node.func): {}} if not node.keywords else _call(node)
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise ParseError(f"unsupported value: {type(node).__name__}")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_LIMIT = 10_000  # elements and characters (repetitions expanded) or bits a computed argument may have


def _arithmetic(node) -> Any:
    """What upstream's ``eval`` of a BinOp (or ``-x``) gives, for literal operands only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex, str, bytes)):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_arithmetic(v) for v in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _arithmetic(node.operand)
        if not isinstance(operand, (int, float, complex)):
            raise ParseError(f"bad operand of a sign: {_unparse(node)[:80]}")
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
            if right > 0 and max(abs(left), 2).bit_length() * right > _LIMIT:
                raise ParseError("power too large")
        if isinstance(node.op, ast.Mod) and isinstance(left, (str, bytes)):
            raise ParseError("string formatting")
        if isinstance(node.op, ast.Mult):
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int) and _items(seq) * count > _LIMIT:
                    raise ParseError("repetition too large")
        try:
            result = _BINARY[type(node.op)](left, right)
        except (TypeError, ValueError, ArithmeticError) as err:
            raise ParseError(f"cannot compute {_unparse(node)[:80]}: {err}") from None
        if isinstance(result, int) and result.bit_length() > _LIMIT:
            raise ParseError("number too large")
        if isinstance(result, (str, bytes, list, tuple)) and _items(result) > _LIMIT:
            raise ParseError("computed value too large")
        return result
    raise ParseError(f"unsupported expression: {_unparse(node)[:80]}")


def _items(seq) -> int:
    """The characters of a string, or the elements of a list written out (nested ones and repeated
    references counted every time, `bounded.literal_size`), what one repetition of it adds."""
    return len(seq) if isinstance(seq, (str, bytes)) else bounded.literal_size(seq, _LIMIT + 1) - 1


# ---------------------------------------------------------------------------------------------
# Checking calls: upstream's model_eval/checker.py (normal_checker and what it calls).

PYTHON_TYPE_MAPPING = {
    "string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list, "dict": dict,
    "any": str, "list": list, "object": dict, "objectArray": list, "list(string)": list, "list(enum)": list,
    "int": int, "enum": enumerate, "number": int,
}
PYTHON_NESTED_TYPE_CHECK_LIST = ("array", "tuple", "list(string)", "list(enum)", "object", "objectArray")


def _fail(error_type: str, error: str) -> dict:
    return {"valid": False, "error": error, "error_type": error_type}


_OK = {"valid": True, "error": "", "error_type": ""}


def standardize_string(text: str) -> str:
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", text).lower().replace("'", '"')


def _answer_type(possible_answer):
    return type(possible_answer) if possible_answer != "" else None


def _type_check(param, value, possible_answer, expected_description, expected_type, nested_type, func_name) -> dict:
    """Upstream's type_checker: ``is_variable`` set means the value is not compared further."""
    result = {"valid": True, "error": "", "error_type": "type_error", "is_variable": False}
    is_variable = False
    answer_type = _answer_type(possible_answer)
    if answer_type is not None and answer_type != expected_type:
        is_variable = True
    if value == "true":
        value = True
    if value == "false":
        value = False
    if type(value) == expected_type:  # noqa: E721 - upstream compares types exactly (bool is not int)
        if nested_type is None:
            result["is_variable"] = is_variable
            return result
        if isinstance(possible_answer, list) and not possible_answer:
            # Upstream finds no answer item to check against and rejects even [] (deviation 2).
            return {"valid": True, "error": "", "error_type": "", "is_variable": is_variable}
        for answer_item in possible_answer if isinstance(possible_answer, (list, tuple, dict, str)) else ():
            flag = True
            if type(answer_item) == list:  # noqa: E721
                for value_item in value:
                    if not _type_check(param, value_item, answer_item, str(nested_type), nested_type, None,
                                       func_name)["valid"]:
                        flag = False
                        break
            if flag:
                return {"valid": True, "error": "", "error_type": "", "is_variable": is_variable}
        result["valid"] = False
        result["error"] = (f"nested type check failed for parameter {param!r}: expected {expected_description} "
                           f"of {nested_type.__name__}, got {value!r}")
    if answer_type is not None and (type(value) == answer_type or possible_answer == value):  # noqa: E721
        result["is_variable"] = True
        return result
    result["valid"] = False
    result["error"] = (f"wrong type for parameter ({param}) of api ({func_name}): expected "
                       f"{expected_type.__name__}, got {type(value).__name__}")
    return result


def _string_check(param, value: str, possible_answer: str, func_name) -> dict:
    if standardize_string(possible_answer) not in standardize_string(value):
        return _fail("value_error:string",
                     f"wrong value for parameter ({param}) of api ({func_name}): expected {possible_answer!r}, got {value!r}")
    return _OK


def _list_check(param, value, possible_answer, func_name) -> dict:
    got = [standardize_string(v) if type(v) == str else v for v in value]  # noqa: E721
    want = [standardize_string(v) if type(v) == str else v for v in possible_answer]  # noqa: E721
    if got != want:
        return _fail("value_error:list/tuple",
                     f"wrong value for parameter ({param}) of api ({func_name}): expected {possible_answer!r}, got {value!r}")
    return _OK


def _dict_check(param, value, possible_answer: dict, func_name) -> dict:
    wrong = _fail("value_error", f"wrong value for parameter ({param}) of api ({func_name}): "
                                 f"expected {possible_answer!r}, got {value!r}")
    if not isinstance(value, dict) or not isinstance(possible_answer, dict):
        return _fail("value_error", f"parameter ({param}) of api ({func_name}): expected an object for "
                                    f"{possible_answer!r}, got {value!r}")
    if len(value) != len(possible_answer):
        return wrong
    for key, item in value.items():
        if item == "true":
            item = True
        if item == "false":
            item = False
        if key not in possible_answer:
            return wrong
        expected = possible_answer[key]
        if isinstance(expected, dict):
            inner = _dict_check(param, item, expected, func_name)
            if not inner["valid"]:
                return inner
            continue
        got = standardize_string(item) if type(item) == str else item  # noqa: E721
        want = standardize_string(expected) if type(expected) == str else expected  # noqa: E721
        if str(want) not in str(got):
            return wrong
    return _OK


def _list_dict_check(param, value, possible_answer, func_name) -> dict:
    if len(value) != len(possible_answer):
        return _fail("value_error:list_dict_count", f"wrong number of objects for parameter ({param}) of api "
                                                    f"({func_name}): expected {len(possible_answer)}, got {len(value)}")
    for item, expected in zip(value, possible_answer):
        result = _dict_check(param, item, expected, func_name)
        if not result["valid"]:
            return result
    return _OK


def _function_check(description: dict, call: dict, answer: dict) -> dict:
    """Upstream's simple_function_checker: one call against one answer ``{name: params}``."""
    params_schema = description.get("parameters", description.get("arguments", {}))
    possible_answer = next(iter(answer.values()))
    model_params = next(iter(call.values()))
    if model_params == {} and params_schema == {}:
        return _OK
    if model_params == {} or params_schema == {}:
        return _fail("wrong_param", "the call has no arguments" if model_params == {} else "the function takes none")
    properties = params_schema.get("properties", {}) if isinstance(params_schema, dict) else {}
    if possible_answer == properties:
        return _OK
    if possible_answer == {}:
        return _fail("wrong_param", "the answer takes no arguments")
    func_name = description["name"]
    if func_name not in call:
        return _fail("wrong_function_name", f"expected {func_name}, got {next(iter(call))}")
    model_params = call[func_name]
    for param in params_schema.get("required", []):
        if param not in model_params:
            return _fail("lack_args", f"missing required parameter {param} of api ({func_name})")
    for param, value in model_params.items():
        if param not in properties or param not in possible_answer:
            return _fail("addition_args", f"parameter {param} of api ({func_name}) is not in the answer")
        expected_description = properties[param].get("type") if isinstance(properties[param], dict) else None
        if expected_description not in PYTHON_TYPE_MAPPING:
            # Upstream raises here (KeyError); no ground-truth parameter of the data does.
            return _fail("type_error", f"the schema of parameter {param} of api ({func_name}) has type "
                                       f"{expected_description!r}, which the checker does not know")
        expected_type = PYTHON_TYPE_MAPPING[expected_description]
        nested_type = None
        if expected_description in PYTHON_NESTED_TYPE_CHECK_LIST:
            items = properties[param].get("items")
            nested = items.get("type") if isinstance(items, dict) else None
            if nested is None:
                nested = "string" if "string" in expected_description else "enum" if "enum" in expected_description else "dict"
                answer = possible_answer[param]
                if expected_type == list and isinstance(answer, list) and not all(isinstance(a, dict) for a in answer):
                    # Upstream takes an array without an item type for a list of objects and rejects
                    # the answer's own list of strings (deviation 3); compare it as a plain list.
                    nested = "list(string)"
            nested_type = PYTHON_TYPE_MAPPING.get(nested, dict)
        if expected_description == "tuple" and type(value) == tuple:  # noqa: E721
            value = list(value)
        if expected_description == "float" and type(value) == int:  # noqa: E721
            value = float(value)
        typed = _type_check(param, value, possible_answer[param], expected_description, expected_type, nested_type,
                            func_name)
        if not typed["valid"]:
            return _fail(typed["error_type"], typed["error"])
        if typed["is_variable"]:
            continue
        if expected_type == dict:
            result = _dict_check(param, value, possible_answer[param], func_name)
        elif expected_type == list and nested_type == dict:
            result = _list_dict_check(param, value, possible_answer[param], func_name)
        elif expected_type == str:
            result = _string_check(param, value, possible_answer[param], func_name)
        elif expected_type == list:
            result = _list_check(param, value, possible_answer[param], func_name)
        else:  # integers, numbers, booleans: upstream compares their types only
            continue
        if not result["valid"]:
            return result
    return _OK


def _find_description(functions: list, name: str) -> dict | None:
    """Upstream's find_description: the first function whose name is contained in ``name``."""
    for description in functions:
        if isinstance(description, dict) and description.get("name", "") in name:
            return description
    return None


def normal_check(functions: list, calls: list[dict], answer: dict) -> dict:
    """Upstream's normal_checker: the parsed calls against one possible answer ``{name: params}``."""
    if len(calls) != len(answer):
        return _fail("wrong functions number", f"{len(calls)} calls, the answer has {len(answer)}")
    answer_names = list(answer)
    answers = [{_base_name(name): params} for name, params in answer.items()]
    got, want = Counter(next(iter(c)) for c in calls), Counter(next(iter(a)) for a in answers)
    for name in got:
        if name not in want:
            return _fail("function_mismatch", f"function {name} is not in the answer")
    for name in want:
        if name not in got:
            return _fail("function_mismatch", f"function {name} of the answer is not called")
    for name, count in got.items():
        if count != want[name]:
            return _fail("function_mismatch", f"{name} called {count} times, the answer calls it {want[name]}")
    for name, expected in zip(answer_names, answers):
        description = _find_description(functions, name)
        if description is None:
            return _fail("function_mismatch", f"function {name} of the answer is not in the function list")
        failures = []
        for index, call in enumerate(calls):
            if next(iter(call)) == next(iter(expected)):
                result = _function_check(description, call, expected)
                if result["valid"]:
                    break
                failures.append((index, result))
        else:
            if not failures:
                return _fail("function_mismatch", f"function {name} of the answer is not called")
            if len(failures) == 1:
                return failures[0][1]
            return _fail(failures[-1][1]["error_type"], f"no call matches answer {name}: " +
                         "; ".join(f"call {index}: {result['error']}" for index, result in failures))
    return _OK


def scalars_match(calls: list[dict], answer: dict) -> bool:
    """Stricter than upstream: some one-to-one pairing of calls and answer calls (same name) has
    every integer, number and boolean of the answer equal in the call (where the call has it)."""
    answers = [(_base_name(name), params) for name, params in answer.items()]
    if len(calls) != len(answers):
        return False

    def pair(i: int, used: frozenset) -> bool:
        if i == len(answers):
            return True
        name, params = answers[i]
        return any(j not in used and name in calls[j] and _leaves_equal(params, calls[j][name]) and
                   pair(i + 1, used | {j}) for j in range(len(calls)))

    return pair(0, frozenset())


def _leaves_equal(expected, got) -> bool:
    if got == "true":
        got = True
    elif got == "false":
        got = False
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(_leaves_equal(v, got[k]) for k, v in expected.items() if k in got)
    if isinstance(expected, list):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(_leaves_equal(e, g) for e, g in zip(expected, got)))
    if isinstance(expected, bool):
        return isinstance(got, bool) and got == expected
    if isinstance(expected, (int, float)):
        return (isinstance(got, (int, float)) and not isinstance(got, bool)
                and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12))
    return True


def special_check(category: str, reply: str, ground_truth) -> dict:
    """Upstream's special_eval: phrases and names in the raw reply."""
    if "incomplete" in category:
        for name, missing in ground_truth.items():
            if "Missing necessary parameters" not in reply:
                return _fail("error_detection", "the reply does not say 'Missing necessary parameters'")
            if name not in reply:
                return _fail("error_correction", f"the reply does not name the function {name}")
            for value in missing:
                if value not in reply:
                    return _fail("error_correction", f"the reply does not name the missing parameter {value} of {name}")
        return _OK
    if "error" in category:
        for name, values in ground_truth.items():
            if "There is incorrect value" not in reply:
                return _fail("error_detection", "the reply does not say 'There is incorrect value'")
            for value in values:
                if value not in reply:
                    return _fail("error_correction", f"the reply does not quote the incorrect value {value!r} of {name}")
        return _OK
    if "irrelevant" in category:
        if "the limitations of the function" not in reply:
            return _fail("error_detection", "the reply does not say 'the limitations of the function'")
        return _OK
    raise ValueError(f"not a special category: {category}")


def answer_as_reply(category: str, ground_truth) -> str:
    """The reply that upstream's prompt asks for, written from the ground truth (tests, checks)."""
    if category == "special_incomplete":
        return "[" + ", ".join(json.dumps(f"Missing necessary parameters ({', '.join(v)}) for the api ({k})")
                               for k, v in ground_truth.items()) + "]"
    if category == "special_error_param":
        values = [v for vs in ground_truth.values() for v in vs]
        return "[" + json.dumps(f"There is incorrect value ({', '.join(values)}) for the parameters "
                                f"({', '.join(ground_truth)}) in the conversation history.") + "]"
    if category == "special_irrelevant":
        return '["Due to the limitations of the function, I cannot solve this problem."]'
    answer = ground_truth[0] if isinstance(ground_truth, list) else ground_truth
    calls = []
    for name, params in answer.items():
        arguments = ", ".join(f"{k}={v!r}" for k, v in params.items())
        calls.append(f"{_base_name(name)}({arguments})")
    return "[" + ", ".join(calls) + "]"


def _base_name(name: str) -> str:
    """``name_2`` -> ``name``: how an answer writes a second call of the same function."""
    return re.sub(r"_\d+$", "", name)


# ---------------------------------------------------------------------------------------------
# The suite.


@dataclasses.dataclass(frozen=True)
class Reference:
    category: str
    ground_truth: Any
    functions: list


@dataclasses.dataclass
class ACEBenchSuite:
    directory: Path
    settings: GenerationSettings
    rows: dict  # category -> [(row, ground truth)]
    notes: list = dataclasses.field(default_factory=list)
    name: str = "acebench"

    def all_items(self) -> list[Item]:
        items = []
        for category in CATEGORIES:
            for row, truth in self.rows.get(category, ()):
                items.append(Item(str(row["id"]), group=category, messages=build_messages(category, row),
                                  reference=Reference(category, truth, row["function"])))
        return items

    def items(self, limit: int | None, seed: int) -> list[Item]:
        """All items (category by category, in file order), or ``limit`` of them spread across the
        categories in turn, each category's picked in a ``seed``-fixed order."""
        items = self.all_items()
        return [items[i] for i in spread([item.group for item in items], limit, seed, "acebench")]

    def score(self, item: Item, reply, context: Context | None = None) -> Score:
        ref: Reference = item.reference
        details: dict = {"category": ref.category}
        if "multi_turn" in ref.category:
            details["conversation"] = item.item_id.rsplit("_", 1)[0]
        if not isinstance(reply, str):
            return _score(details, _fail("wrong_output_format", "the reply is not text"))
        if ref.category.startswith("special"):
            return _score(details, special_check(ref.category, reply, ref.ground_truth))
        # normal_multi_turn_eval parses the whole reply with its whitespace removed (here: outside
        # string literals, deviation 1); normal_single_turn_eval the first [...] of the reply.
        text = without_whitespace(reply) if "normal_multi_turn" in ref.category else outermost_brackets(reply)
        try:
            calls = parse_calls(text)
        except ParseError as err:
            return _score(details, _fail("wrong_output_format", f"cannot parse the calls: {err}"))
        details["calls"] = jsonable(calls, default=repr)
        answers = ref.ground_truth if isinstance(ref.ground_truth, list) else [ref.ground_truth]
        answers = [answer for answer in answers if isinstance(answer, dict)]
        first = None if answers else _fail("no_answer", "the item has no possible answer of calls")
        for index, answer in enumerate(answers):
            verdict = normal_check(ref.functions, calls, answer)
            if verdict["valid"]:
                if len(answers) > 1:
                    details["answer"] = index
                details["scalars_match"] = scalars_match(calls, answer)
                return _score(details, verdict)
            first = first or verdict
        details["scalars_match"] = False
        return _score(details, first)


def _score(details: dict, verdict: dict) -> Score:
    valid = bool(verdict["valid"])
    details = dict(details, valid=valid)
    if not valid:
        details.update(error_type=verdict["error_type"], error=verdict["error"])
    return Score(1.0 if valid else 0.0, valid, details)


def data_dir(argument: str, eval_config, prefix: str = "acebench") -> Path:
    """The data folder a spec's argument, else ``eval_config.acebench_dir``, points to (`find_data`);
    SuiteUnavailable saying where to get it when there is none."""
    given = argument or getattr(eval_config, "acebench_dir", "") or ""
    if not given:
        raise SuiteUnavailable(WHERE.format(prefix=prefix))
    directory = find_data(Path(given).expanduser())
    if directory is None:
        raise SuiteUnavailable(f"{given}: {WHERE.format(prefix=prefix)}")
    return directory


def find_data(directory: Path) -> Path | None:
    """The folder holding ``data_<category>.json`` (of any category, the agent ones included) and
    ``possible_answer/``: DIR itself, or DIR's ``data_en`` or ``data_all/data_en`` (a clone of
    the repository)."""
    for candidate in (directory, directory / "data_en", directory / "data_all" / "data_en"):
        if candidate.is_dir() and any((candidate / f"data_{c}.json").is_file()
                                      for c in CATEGORIES + AGENT_CATEGORIES):
            return candidate
    return None


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load(directory: Path) -> tuple[dict, list[str]]:
    rows, notes = {}, []
    for category in CATEGORIES:
        data, answers = directory / f"data_{category}.json", directory / "possible_answer" / f"data_{category}.json"
        if not data.is_file():
            notes.append(f"{category}: no {data.name}; left out")
            continue
        if not answers.is_file():
            notes.append(f"{category}: no possible_answer/{answers.name}; left out")
            continue
        try:
            truth = {str(a["id"]): a["ground_truth"] for a in _read_jsonl(answers)}
            lines = _read_jsonl(data)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SuiteUnavailable(f"{data} or its possible answers are not ACEBench JSON lines: {err}") from None
        missing = [str(r.get("id")) for r in lines if str(r.get("id")) not in truth]
        if missing:
            notes.append(f"{category}: {len(missing)} items without a possible answer left out ({', '.join(missing[:3])})")
        rows[category] = [(r, truth[str(r["id"])]) for r in lines if str(r.get("id")) in truth]
    notes.append("agent categories (agent_multi_turn, agent_multi_step) are not included")
    notes.append("a reply equal to a possible answer always scores 1 (upstream rejects 29 of the 973 English "
                 "answers: whitespace stripped inside multi-turn strings, empty lists, untyped arrays)")
    notes.append("normal_multi_turn_* groups score every turn; upstream's headline counts a conversation "
                 "right only when all its turns are (details.conversation)")
    notes.append("upstream compares the types, not the values, of integer/number/boolean arguments; "
                 "details.scalars_match says whether the values match too")
    return rows, notes


@register("acebench", GenerationSettings(temperature=0.0, max_new_tokens=1024),
          summary="ACEBench normal and special categories (tool calls in one reply), scored as upstream does")
def make(argument: str, settings: GenerationSettings, eval_config) -> ACEBenchSuite:
    """ACEBench normal and special categories (tool calls in one reply), scored as upstream does."""
    directory = data_dir(argument, eval_config)
    rows, notes = load(directory)
    if not rows:
        raise SuiteUnavailable(f"{directory}: no normal or special category with its possible answers; "
                               f"{WHERE.format(prefix='acebench')}")
    return ACEBenchSuite(directory, settings, rows, notes)
