"""The house rules a script can check (docs/STYLE.md, issue 14): every module of lathe opens with a docstring
saying what it owns, and at most two functions are over 60 lines (a long function becomes named parts). The
module line limit, with its declared-table allowlist, and the layout rules are tests/test_layout.py. The
failure message lists what breaks a rule, with its length."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "lathe"
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS_ALLOWED = 2


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            yield node.name, first, node.end_lineno - first + 1


def test_every_module_opens_with_a_docstring():
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in _modules()
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert missing == []


def test_at_most_two_functions_are_over_60_lines():
    long_functions = []
    for path in _modules():
        for name, line, length in _functions(ast.parse(path.read_text())):
            if length > MAX_FUNCTION_LINES:
                long_functions.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)")
    assert len(long_functions) <= LONG_FUNCTIONS_ALLOWED, long_functions


def test_the_checks_see_the_package():
    # A wrong path would make the rules above pass on nothing.
    assert len(_modules()) > 100 and (PACKAGE / "train" / "trainer.py").is_file()
