"""The tools tau-bench's domains share, word for word: ``calculate``, ``think`` and
``transfer_to_human_agents``.

One implementation for every domain, so a fix reaches all of them and ``code(a)``
(``factory.envsim.steps.tool_source``) shows the same source (with its bounded
evaluator) whichever domain calls it. ``calculate`` keeps tau-bench's
``eval(expression, {"__builtins__": None}, {})`` semantics, except that ``**`` chains
whose result would exceed about a million bits are refused (tau-bench would compute
for hours, then fail converting to float).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable
from typing import Any

from factory.errors import EnvironmentError_

__all__ = ["calculate", "think", "transfer_to_human_agents"]


def _refuse(message: str) -> EnvironmentError_:
    return EnvironmentError_(message)


_CALC_CHARS = frozenset("0123456789+-*/(). ")
_MAX_BITS = 1 << 20


def calculate(data: dict[str, Any], expression: str) -> str:
    if not all(char in _CALC_CHARS for char in expression):
        raise _refuse("invalid characters in expression")
    return str(round(float(_evaluate(expression)), 2))


def _evaluate(expression: str) -> Any:
    """``eval(expression, {"__builtins__": None}, {})``, minus the unbounded ``**``."""
    if not isinstance(expression, str):
        raise TypeError("eval() arg 1 must be a string, bytes or code object")
    source = expression.lstrip(" \t")  # what eval() does to a string first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "(1)(2)" warns at compile time, then fails at run
        tree = ast.parse(source, "<string>", "eval")
        if not any(isinstance(n, ast.Pow) for n in ast.walk(tree)):
            return eval(compile(tree, "<string>", "eval"), {"__builtins__": None}, {})
    return _eval_node(tree.body)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Pow: lambda a, b: a**b,
}


def _bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 64


def _huge_power(base: Any, exponent: Any) -> bool:
    if not (isinstance(base, int) and isinstance(exponent, int)):
        return False  # float powers overflow on their own, quickly
    return exponent > 0 and abs(base) > 1 and _bits(base) * exponent > _MAX_BITS


def _eval_node(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return +_eval_node(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and _huge_power(left, right):
            raise OverflowError("result too large")
        if isinstance(node.op, ast.Mult) and _bits(left) + _bits(right) > 2 * _MAX_BITS:
            raise OverflowError("result too large")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Tuple):
        return tuple(_eval_node(e) for e in node.elts)
    if isinstance(node, ast.Call):
        func = _eval_node(node.func)
        for arg in node.args:
            _eval_node(arg.value if isinstance(arg, ast.Starred) else arg)
        raise TypeError(f"'{type(func).__name__}' object is not callable")
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def think(data: dict[str, Any], thought: str) -> str:
    return ""


def transfer_to_human_agents(data: dict[str, Any], summary: str) -> str:
    return "Transfer successful"
