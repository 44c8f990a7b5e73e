"""A calculator tool over HTTP, Heddle's tool protocol (docs/rollouts.md): stdlib only.

    python examples/tool-calls/calculator.py --port 8765

``POST /`` with ``{"name": "calculator", "arguments": {"expression": "17*23"}}``
answers ``{"content": "391"}``. Expressions are parsed with ``ast`` and only
numbers, + - * / // % ** and parentheses are evaluated (no names, no calls);
anything else answers 400 with a sentence, which the session hands to the model.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_OPS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError says what is not allowed."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponents above 64 are not allowed")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")

    try:
        return walk(ast.parse(str(expression).replace("^", "**"), mode="eval").body)
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def answer(body: Any) -> tuple[int, str]:
    """(status, reply text) for one call body."""
    args = body.get("arguments") if isinstance(body, dict) else None
    expression = args.get("expression") if isinstance(args, dict) else None
    if not isinstance(expression, str | int | float):
        return 400, 'arguments must be {"expression": "<arithmetic>"}'
    try:
        value = evaluate(str(expression))
    except ValueError as exc:
        return 400, str(exc)
    return 200, f"{value:g}" if isinstance(value, float) else str(value)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            body = None
        status, text = answer(body)
        raw = json.dumps({"content": text} if status == 200 else {"error": text}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def write_tasks(path: str, count: int = 50, seed: int = 25) -> None:
    """The example's questions (tasks.jsonl is this with the defaults)."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            a, b = rng.randint(12, 99), rng.randint(12, 99)
            op = ["+", "-", "*"][i % 3]
            word = {"+": "plus", "-": "minus", "*": "times"}[op]
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            row = {"id": f"calc-{i:02d}", "prompt": f"What is {a} {word} {b}? Use the calculator.",
                   "metadata": {"answer": str(value)}}  # fmt: skip
            f.write(json.dumps(row) + "\n")


def serve(host: str, port: int) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), Handler)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--write-tasks", metavar="PATH", help="write the questions and exit")
    args = parser.parse_args()
    if args.write_tasks:
        write_tasks(args.write_tasks)
        raise SystemExit(0)
    server = serve(args.host, args.port)
    print(f"calculator on http://{args.host}:{server.server_address[1]}/", flush=True)
    server.serve_forever()
