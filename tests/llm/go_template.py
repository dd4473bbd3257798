"""A small interpreter of the Go text/template subset lathe writes into Ollama Modelfiles (range over
.Messages, if / else if / end, eq .Role "x", .Content, $variables declared with := and assigned with =,
string literals), written from Go's text/template rules so tests can render the TEMPLATE as Ollama would.
Anything outside the subset raises, so a Modelfile using more fails the tests instead of passing them."""

from __future__ import annotations

import re

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.DOTALL)


def _parse(source: str):
    """-> nested nodes: ("text", s) | ("print", expr) | ("set", name, expr, declare) | ("if", [(cond, body)], else)
    | ("range", expr, body)."""
    tokens, position = [], 0
    for match in _ACTION.finditer(source):
        text = source[position : match.start()]
        if match.group(1):
            text = text.rstrip()
        tokens.append(("text", text))
        tokens.append(("action", match.group(2), bool(match.group(3))))
        position = match.end()
    tokens.append(("text", source[position:]))
    # a trailing "-}}" trims the following text's leading white space
    for index, token in enumerate(tokens):
        if token[0] == "action" and token[2] and index + 1 < len(tokens):
            tokens[index + 1] = ("text", tokens[index + 1][1].lstrip())
    body, rest = _block(tokens, 0)
    if rest != len(tokens):
        raise ValueError("unbalanced {{ end }}")
    return body


def _block(tokens, index):
    nodes = []
    while index < len(tokens):
        token = tokens[index]
        if token[0] == "text":
            if token[1]:
                nodes.append(("text", token[1]))
            index += 1
            continue
        action = token[1]
        if action == "end" or action == "else" or action.startswith("else if "):
            return nodes, index
        if action.startswith("range "):
            body, index = _block(tokens, index + 1)
            if tokens[index][1] != "end":
                raise ValueError("range without end")
            nodes.append(("range", action[6:].strip(), body))
            index += 1
        elif action.startswith("if "):
            branches, otherwise = [(action[3:].strip(), None)], []
            body, index = _block(tokens, index + 1)
            branches[0] = (branches[0][0], body)
            while tokens[index][1].startswith("else if "):
                condition = tokens[index][1][8:].strip()
                body, index = _block(tokens, index + 1)
                branches.append((condition, body))
            if tokens[index][1] == "else":
                otherwise, index = _block(tokens, index + 1)
            if tokens[index][1] != "end":
                raise ValueError("if without end")
            nodes.append(("if", branches, otherwise))
            index += 1
        elif re.fullmatch(r"\$\w+\s*:?=\s*.+", action):
            name, declare, expr = re.fullmatch(r"(\$\w+)\s*(:?)=\s*(.+)", action).groups()
            nodes.append(("set", name, expr, bool(declare)))
            index += 1
        else:
            nodes.append(("print", action))
            index += 1
    return nodes, index


def _value(expr: str, dot, scope: dict):
    expr = expr.strip()
    if expr.startswith('"') and expr.endswith('"'):
        return expr[1:-1]
    if expr.startswith("eq "):
        left, right = re.fullmatch(r'eq\s+(\S+)\s+(".*?"|\S+)', expr).groups()
        return _value(left, dot, scope) == _value(right, dot, scope)
    if expr.startswith("$"):
        if expr not in scope:
            raise ValueError(f"undefined variable {expr}")
        return scope[expr]
    if expr.startswith("."):
        if not isinstance(dot, dict) or expr[1:] not in dot:
            raise ValueError(f"no field {expr}")
        return dot[expr[1:]]
    raise ValueError(f"expression outside the subset: {expr!r}")


def _run(nodes, dot, scope, out):
    for node in nodes:
        kind = node[0]
        if kind == "text":
            out.append(node[1])
        elif kind == "print":
            out.append(str(_value(node[1], dot, scope)))
        elif kind == "set":
            if not node[3] and node[1] not in scope:
                raise ValueError(f"assignment to undeclared {node[1]}")
            scope[node[1]] = _value(node[2], dot, scope)
        elif kind == "if":
            for condition, body in node[1]:
                if _value(condition, dot, scope):
                    _run(body, dot, scope, out)
                    break
            else:
                _run(node[2], dot, scope, out)
        elif kind == "range":
            for item in _value(node[1], dot, scope):
                _run(node[2], item, scope, out)


def render(template: str, messages: list[dict], system: str = "") -> str:
    """What Ollama's renderer prints for these messages (Role / Content per message)."""
    data = {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages], "System": system}
    out: list[str] = []
    _run(_parse(template), data, {}, out)
    return "".join(out)
