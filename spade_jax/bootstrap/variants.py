"""Structural variants of seed programs: the same game, written in a different shape.

The tiny preset's bootstrap trains its designer on these so that the programs it writes
are not near-duplicates of the archived seed sources. Admission's novelty stage compares
programs by normalised-token shingles (`spade_jax.admission.similarity`): identifiers,
strings and numbers are all alike there, so renaming or rewording changes nothing and
only the *shape* of the code counts. Every rewrite below changes shape and keeps what
the agent sees: observations, rewards, termination and `solution()` are those of the
seed for every seed and action (info dicts may carry extra entries).

A variant applies each rewrite with probability p, and then at every site where it is safe,
so one program is written in one consistent style: the bootstrapped model, writing token by
token, can copy the style of the previous site instead of guessing each one. Every rewrite
is local: applying it at a site never requires a matching change elsewhere.

  split_assign      ``a, b = x, y`` -> two statements (when y does not read a)
  join_assign       two independent simple assignments -> one tuple assignment
  invert_if         ``if c: A else: B`` -> ``if not c: B else: A``
  ternary_to_if     ``x = a if c else b`` -> an if statement
  comp_to_loop      ``x = [e for v in it if c]`` (list, dict) -> a loop that appends
  hoist_join        ``s.join(e for v in it)`` -> a named list, then the join
  fstring_format    ``f"..{x}.."`` -> ``"..{}..".format(x)`` or string concatenation
  expand_aug        ``x += 1`` -> ``x = x + 1`` (constant right-hand sides)
  dict_call         ``{}`` / ``[]`` in return values -> ``dict()`` / ``list()``
  keyword_args      ``self._helper(a, b)`` -> keyword arguments for defaulted parameters
  hoist_message     ``return self._helper("..", ..)`` -> ``message = ".."`` first
  result_helper     the games' shared ``_result`` helper -> one of several equivalent bodies
  done_guard        the games' "episode is over" return -> through ``_result``
  tool_schema       ``{"type": "function", "function": {...}}`` -> the bare function schema
  base_init         ``super().__init__(..)`` -> ``ToolUseEnv.__init__(self, ..)``

The result is printed in the seeds' style (double quotes, no redundant parentheses, blank
lines between definitions, knob comments kept). Standard library only.
"""

from __future__ import annotations

import ast
import copy
import random
import re

__all__ = ["REWRITES", "format_program", "vary"]

_TEMP_NAMES = ("message", "reply", "feedback")  # the first one free in the function is used
_LIST_NAMES = ("parts", "pieces", "entries")


# --------------------------------------------------------------------------- printing


class _Printer(ast._Unparser):  # noqa: SLF001 - the stdlib unparser, with the seeds' style
    """``ast.unparse`` without redundant parentheses and with double-quoted strings."""

    def visit_Return(self, node):
        if isinstance(node.value, ast.Tuple) and node.value.elts:
            self.set_precedence(ast._Precedence.TUPLE, node.value)  # noqa: SLF001
        super().visit_Return(node)

    def visit_Assign(self, node):
        if isinstance(node.value, ast.Tuple) and node.value.elts:
            self.set_precedence(ast._Precedence.TUPLE, node.value)  # noqa: SLF001
        super().visit_Assign(node)

    def visit_BoolOp(self, node):
        # The stdlib raises the precedence for every further operand, so ``a and b and c == d``
        # would print as ``a and b and (c == d)``; every operand binds tighter than the operator.
        operator = self.boolops[node.op.__class__.__name__]
        operand_precedence = self.boolop_precedence[operator].next()

        def traverse(value):
            self.set_precedence(operand_precedence, value)
            self.traverse(value)

        with self.require_parens(self.boolop_precedence[operator], node):
            self.interleave(lambda: self.write(f" {operator} "), traverse, node.values)

    def visit_Call(self, node):
        if len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.GeneratorExp):
            self.set_precedence(ast._Precedence.ATOM, node.func)  # noqa: SLF001
            self.traverse(node.func)
            generator = node.args[0]
            with self.delimit("(", ")"):
                self.traverse(generator.elt)
                for comprehension in generator.generators:
                    self.traverse(comprehension)
            return
        super().visit_Call(node)

    def _str_literal_helper(self, string, *, quote_types=ast._ALL_QUOTES, escape_special_whitespace=False):  # noqa: SLF001
        preferred = sorted(quote_types, key=lambda quote: quote[0] != '"')
        return super()._str_literal_helper(
            string, quote_types=preferred, escape_special_whitespace=escape_special_whitespace)

    def _write_constant(self, value):
        if isinstance(value, str) and not self._avoid_backslashes:
            text = repr(value)
            if text[0] == "'" and '"' not in value:
                text = f'"{text[1:-1]}"'
            self.write(text)
        else:
            super()._write_constant(value)


def format_program(tree: ast.Module, original: str = "") -> str:
    """Source text of ``tree`` in the seeds' layout; knob comments are copied from ``original``."""
    text = _Printer().visit(ast.fix_missing_locations(tree))
    comments = dict(re.findall(r"^([A-Z][A-Z0-9_]*) = -?\d+(  # .*)$", original, re.MULTILINE))
    out: list[str] = []
    in_string = False
    previous_top = ""
    for line in text.split("\n"):
        starts_in_string = in_string
        if line.count('"""') % 2:
            in_string = not in_string
        if starts_in_string or not line or line[0] == " ":
            out.append(line)
            continue
        kind = "import" if line.startswith(("import ", "from ")) else (
            "def" if line.startswith(("class ", "def ", "@")) else "other")
        while out and out[-1] == "":
            out.pop()
        if out:
            if kind == "def" and previous_top != "decorator":
                out.extend(["", ""])
            elif previous_top in ("docstring", "def") or (previous_top == "import") != (kind == "import"):
                out.append("")
        knob = re.match(r"^([A-Z][A-Z0-9_]*) = -?\d+$", line)
        out.append(line + comments[knob.group(1)] if knob and knob.group(1) in comments else line)
        previous_top = "docstring" if line.startswith('"""') and not out[:-1] else (
            "decorator" if line.startswith("@") else kind)
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- AST helpers


def _names(node: ast.AST) -> set[str]:
    """Every identifier a subtree mentions (variables, arguments, attributes)."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.arg):
            out.add(sub.arg)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _reads(node: ast.AST, target: ast.AST) -> bool:
    """Whether evaluating ``node`` may read ``target`` (a Name or an attribute of self)."""
    for sub in ast.walk(node):
        if isinstance(target, ast.Name) and isinstance(sub, ast.Name) and sub.id == target.id:
            return True
        if isinstance(target, ast.Attribute):
            if isinstance(sub, ast.Attribute) and sub.attr == target.attr:
                return True
            if isinstance(sub, ast.Call) and _is_self_attr(sub.func):
                return True  # a method may read the attribute
    return False


def _is_self_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _simple_target(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) or _is_self_attr(node)


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _statement_lists(node: ast.AST):
    """Every list of statements under ``node`` (bodies, else branches), innermost last."""
    for sub in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(sub, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts


def _env_class(tree: ast.Module) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env"):
            return node
    return None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _statements(text: str) -> list[ast.stmt]:
    return ast.parse(text).body


def _fresh(choices, taken: set[str]) -> str | None:
    return next((name for name in choices if name not in taken), None)


def _rewrite_lists(tree: ast.Module, rewrite_one) -> None:
    """Applies ``rewrite_one(stmts, i, function) -> (statements consumed, replacement) | None`` at every site."""
    for function in list(_functions(tree)):
        for stmts in list(_statement_lists(function)):
            i = 0
            while i < len(stmts):
                replacement = rewrite_one(stmts, i, function)
                if replacement is None:
                    i += 1
                    continue
                consumed, new = replacement
                stmts[i : i + consumed] = new
                i += len(new)


# --------------------------------------------------------------------------- rewrites


def split_assign(tree, rng):
    def one(stmts, i, _):
        node = stmts[i]
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple) and len(node.targets[0].elts) == len(node.value.elts)):
            return None
        targets, values = node.targets[0].elts, node.value.elts
        if not all(_simple_target(t) for t in targets):
            return None
        if len({ast.dump(t) for t in targets}) != len(targets):
            return None
        for j, value in enumerate(values):
            if any(_reads(value, t) for t in targets[:j]):
                return None
        return 1, [ast.Assign(targets=[t], value=v) for t, v in zip(targets, values)]

    _rewrite_lists(tree, one)


def _short_value(node: ast.expr) -> bool:
    """A value that reads well inside a tuple assignment."""
    if isinstance(node, (ast.Tuple, ast.IfExp, ast.Lambda, ast.ListComp, ast.DictComp, ast.SetComp,
                         ast.GeneratorExp, ast.JoinedStr)):
        return False
    return len(ast.unparse(node)) <= 40


def join_assign(tree, rng):
    def one(stmts, i, _):
        if i + 1 >= len(stmts):
            return None
        first, second = stmts[i], stmts[i + 1]
        for node in (first, second):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _simple_target(node.targets[0])
                    and _short_value(node.value)):
                return None
        a, b = first.targets[0], second.targets[0]
        if ast.dump(a) == ast.dump(b) or _reads(second.value, a):
            return None
        return 2, [ast.Assign(targets=[ast.Tuple(elts=[a, b], ctx=ast.Store())],
                              value=ast.Tuple(elts=[first.value, second.value], ctx=ast.Load()))]

    _rewrite_lists(tree, one)


_FLIPS = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
          ast.IsNot: ast.Is}


def _negate(test: ast.expr) -> ast.expr:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _FLIPS:
        return ast.Compare(left=test.left, ops=[_FLIPS[type(test.ops[0])]()], comparators=test.comparators)
    return ast.UnaryOp(op=ast.Not(), operand=test)


def invert_if(tree, rng):
    def one(stmts, i, _):
        node = stmts[i]
        if not isinstance(node, ast.If) or not node.orelse:
            return None
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            return None  # an elif chain
        return 1, [ast.If(test=_negate(node.test), body=node.orelse, orelse=node.body)]

    _rewrite_lists(tree, one)


def ternary_to_if(tree, rng):
    def one(stmts, i, _):
        node = stmts[i]
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.IfExp)):
            return None
        target, value = node.targets[0], node.value
        if not (_simple_target(target) or isinstance(target, ast.Tuple)):
            return None
        return 1, [ast.If(test=value.test, body=[ast.Assign(targets=[target], value=value.body)],
                          orelse=[ast.Assign(targets=[copy.deepcopy(target)], value=value.orelse)])]

    _rewrite_lists(tree, one)


def _loop_variables(comprehension: ast.comprehension) -> set[str]:
    return {n.id for n in ast.walk(comprehension.target) if isinstance(n, ast.Name)}


def _used_outside(function: ast.FunctionDef, names: set[str], inside: ast.AST) -> bool:
    """Whether any of ``names`` appears in ``function`` outside the subtree ``inside``."""
    inner = {id(n) for n in ast.walk(inside)}
    for node in ast.walk(function):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if isinstance(node, ast.arg) and node.arg in names:
            return True
    return False


def _condition(ifs: list[ast.expr]) -> ast.expr | None:
    if not ifs:
        return None
    return ifs[0] if len(ifs) == 1 else ast.BoolOp(op=ast.And(), values=list(ifs))


def comp_to_loop(tree, rng):
    def one(stmts, i, function):
        node = stmts[i]
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _simple_target(node.targets[0])
                and isinstance(node.value, (ast.ListComp, ast.DictComp)) and len(node.value.generators) == 1):
            return None
        target, comp = node.targets[0], node.value
        generator = comp.generators[0]
        if generator.is_async or _reads(comp, target):
            return None
        if _used_outside(function, _loop_variables(generator), comp):
            return None
        store = copy.deepcopy(target)
        load = copy.deepcopy(target)
        load.ctx = ast.Load()
        if isinstance(comp, ast.ListComp):
            start = ast.List(elts=[], ctx=ast.Load())
            add = ast.Expr(ast.Call(func=ast.Attribute(value=load, attr="append", ctx=ast.Load()),
                                    args=[comp.elt], keywords=[]))
        else:
            start = ast.Dict(keys=[], values=[])
            add = ast.Assign(targets=[ast.Subscript(value=load, slice=comp.key, ctx=ast.Store())], value=comp.value)
        test = _condition(generator.ifs)
        body = [ast.If(test=test, body=[add], orelse=[])] if test is not None else [add]
        loop = ast.For(target=generator.target, iter=generator.iter, body=body, orelse=[])
        return 1, [ast.Assign(targets=[store], value=start), loop]

    _rewrite_lists(tree, one)


def hoist_join(tree, rng):
    def one(stmts, i, function):
        node = stmts[i]
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
            return None
        call = node.value
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "join"
                and isinstance(call.func.value, ast.Constant) and len(call.args) == 1
                and isinstance(call.args[0], ast.GeneratorExp) and not call.keywords):
            return None
        name = _fresh(_LIST_NAMES, _names(function))
        if name is None:
            return None
        generator = call.args[0]
        listing = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                             value=ast.ListComp(elt=generator.elt, generators=generator.generators))
        call.args = [ast.Name(id=name, ctx=ast.Load())]
        return 1, [listing, node]

    _rewrite_lists(tree, one)


def _escape_braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _format_call(node: ast.JoinedStr) -> ast.expr | None:
    template, args = [], []
    for part in node.values:
        if isinstance(part, ast.Constant):
            template.append(_escape_braces(part.value))
            continue
        spec = ""
        if part.format_spec is not None:
            if not all(isinstance(v, ast.Constant) for v in part.format_spec.values):
                return None
            spec = ":" + "".join(v.value for v in part.format_spec.values)
        conversion = "" if part.conversion == -1 else "!" + chr(part.conversion)
        template.append("{" + conversion + spec + "}")
        args.append(part.value)
    if not args:
        return None
    return ast.Call(func=ast.Attribute(value=ast.Constant("".join(template)), attr="format", ctx=ast.Load()),
                    args=args, keywords=[])


def _concatenation(node: ast.JoinedStr) -> ast.expr | None:
    pieces: list[ast.expr] = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            pieces.append(ast.Constant(part.value))
        elif part.format_spec is not None:
            return None
        else:
            wrapper = "repr" if part.conversion == ord("r") else "str"
            pieces.append(ast.Call(func=ast.Name(id=wrapper, ctx=ast.Load()), args=[part.value], keywords=[]))
    if len(pieces) < 2:
        return None
    result = pieces[0]
    for piece in pieces[1:]:
        result = ast.BinOp(left=result, op=ast.Add(), right=piece)
    return result


class _FStrings(ast.NodeTransformer):
    def __init__(self, build):
        self.build = build

    def visit_FormattedValue(self, node):
        return node  # never rewrite format specs

    def visit_JoinedStr(self, node):
        return self.build(node) or node


def fstring_format(tree, rng):
    _FStrings(rng.choice((_format_call, _concatenation))).visit(tree)


def expand_aug(tree, rng):
    def one(stmts, i, _):
        node = stmts[i]
        if not (isinstance(node, ast.AugAssign) and _simple_target(node.target)
                and isinstance(node.value, ast.Constant)):
            return None
        load = copy.deepcopy(node.target)
        load.ctx = ast.Load()
        return 1, [ast.Assign(targets=[node.target], value=ast.BinOp(left=load, op=node.op, right=node.value))]

    _rewrite_lists(tree, one)


def dict_call(tree, rng):
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            for k, element in enumerate(node.value.elts):
                empty_dict = isinstance(element, ast.Dict) and not element.keys
                empty_list = isinstance(element, ast.List) and not element.elts
                if empty_dict or empty_list:
                    name = "dict" if empty_dict else "list"
                    node.value.elts[k] = ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[], keywords=[])


def keyword_args(tree, rng):
    cls = _env_class(tree)
    if cls is None:
        return
    defaults = {}
    for method in cls.body:
        if isinstance(method, ast.FunctionDef) and method.name.startswith("_") and not method.name.startswith("__"):
            params = [a.arg for a in method.args.args[1:]]
            first_default = len(params) - len(method.args.defaults)
            defaults[method.name] = (params, first_default)
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Call) and _is_self_attr(node.func) and node.func.attr in defaults):
            continue
        params, first_default = defaults[node.func.attr]
        if any(isinstance(a, ast.Starred) for a in node.args) or len(node.args) > len(params):
            continue
        if len(node.args) <= first_default:
            continue
        keep = max(first_default, 1)
        moved = [ast.keyword(arg=params[k], value=node.args[k]) for k in range(keep, len(node.args))]
        node.args = node.args[:keep]
        node.keywords = moved + node.keywords


def _string_expression(node: ast.expr) -> bool:
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (
        _string_expression(node.left) or _string_expression(node.right))


def hoist_message(tree, rng):
    def one(stmts, i, function):
        node = stmts[i]
        if not (isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
                and _is_self_attr(node.value.func) and node.value.args
                and _string_expression(node.value.args[0])):
            return None
        name = _fresh(_TEMP_NAMES, _names(function))
        if name is None:
            return None
        message = node.value.args[0]
        node.value.args[0] = ast.Name(id=name, ctx=ast.Load())
        return 1, [ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=message), node]

    _rewrite_lists(tree, one)


_RESULT_CANONICAL = """
def _result(self, observation, reward=0.0, terminated=False):
    truncated = not terminated and self.turn >= self.max_turns
    self.done = terminated or truncated
    if truncated:
        observation += " Out of turns."
    return observation, reward, terminated, truncated, {}
"""
_RESULT_BODIES = (
    """
truncated = False
if not terminated and self.turn >= self.max_turns:
    truncated = True
    observation += " Out of turns."
self.done = terminated or truncated
return observation, reward, terminated, truncated, {}
""",
    """
out_of_turns = self.turn >= self.max_turns
truncated = out_of_turns and not terminated
if truncated:
    observation = observation + " Out of turns."
self.done = terminated or truncated
info = {"turn": self.turn}
return observation, reward, terminated, truncated, info
""",
    """
truncated = not terminated and self.turn >= self.max_turns
if truncated:
    observation += " Out of turns."
if terminated or truncated:
    self.done = True
return observation, reward, terminated, truncated, {"turn": self.turn, "won": reward >= SUCCESS_REWARD}
""",
)


def _same_code(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def result_helper(tree, rng):
    cls = _env_class(tree)
    method = _method(cls, "_result") if cls else None
    if method is None:
        return
    canonical = _statements(_RESULT_CANONICAL)[0]
    if not _same_code(ast.Module(body=method.body, type_ignores=[]),
                      ast.Module(body=canonical.body, type_ignores=[])):
        return
    if "SUCCESS_REWARD" not in _names(tree):
        return
    method.body = _statements(rng.choice(_RESULT_BODIES))


_DONE_GUARD = """
if self.done:
    return "The episode is over.", 0.0, True, False, {}
"""


def done_guard(tree, rng):
    cls = _env_class(tree)
    step = _method(cls, "step") if cls else None
    if step is None or _method(cls, "_result") is None:
        return
    guard = _statements(_DONE_GUARD)[0]
    for k, node in enumerate(step.body):
        if _same_code(node, guard):
            call = _statements('return self._result("The episode is over.", 0.0, True)')[0]
            step.body[k] = ast.If(test=node.test, body=[call], orelse=[])
            return


def tool_schema(tree, rng):
    cls = _env_class(tree)
    if cls is None:
        return
    for node in cls.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "tools" and isinstance(node.value, ast.List)):
            continue
        for k, schema in enumerate(node.value.elts):
            if not isinstance(schema, ast.Dict):
                continue
            entries = {key.value: value for key, value in zip(schema.keys, schema.values)
                       if isinstance(key, ast.Constant)}
            if set(entries) == {"type", "function"} and isinstance(entries["function"], ast.Dict):
                node.value.elts[k] = entries["function"]


def base_init(tree, rng):
    cls = _env_class(tree)
    init = _method(cls, "__init__") if cls else None
    if init is None:
        return
    for stmt in init.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"
                and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
                and call.func.value.func.id == "super" and not call.func.value.args
                and len(cls.bases) == 1 and isinstance(cls.bases[0], ast.Name)):
            call.func = ast.Attribute(value=ast.Name(id=cls.bases[0].id, ctx=ast.Load()), attr="__init__",
                                      ctx=ast.Load())
            call.args = [ast.Name(id="self", ctx=ast.Load()), *call.args]


REWRITES = (
    result_helper, done_guard, tool_schema, base_init, hoist_join, comp_to_loop, split_assign, join_assign,
    ternary_to_if, invert_if, expand_aug, hoist_message, keyword_args, fstring_format, dict_call,
)


def vary(source: str, rng: random.Random, p: float = 0.5) -> str:
    """A structural variant of ``source``: each rewrite is applied with probability ``p``, at all its sites."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rewrite probability p must be in [0, 1], got {p}")
    tree = ast.parse(source)
    for rewrite in REWRITES:
        if rng.random() < p:
            rewrite(tree, rng)
    return format_program(tree, source)
