"""Write code.jsonl: short Python functions to write, each checked by its tests
(``reward: {type: code}`` runs the model's last code block, then the tests, in a
sandboxed subprocess): ``python examples/tasks/make_code.py``.

Each problem here carries a reference solution, which never goes into the task
file; tests/rollout/test_sandbox.py runs every reference through the sandbox
(reward 1.0) and checks the committed file is what this script writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTRUCTION = "Reply with one ```python code block that defines the function."

# (name, signature, what it does, tests, reference solution)
# fmt: off
PROBLEMS: list[tuple[str, str, str, str, str]] = [
    ("add", "add(a, b)", "returns the sum of a and b",
     "assert add(2, 3) == 5\nassert add(-1, 1) == 0",
     "def add(a, b):\n    return a + b"),
    ("is_even", "is_even(n)", "returns True if the integer n is even, else False",
     "assert is_even(4)\nassert not is_even(7)\nassert is_even(0)",
     "def is_even(n):\n    return n % 2 == 0"),
    ("square", "square(x)", "returns x times x",
     "assert square(3) == 9\nassert square(-4) == 16",
     "def square(x):\n    return x * x"),
    ("maximum", "maximum(xs)", "returns the largest number in the non-empty list xs",
     "assert maximum([1, 5, 3]) == 5\nassert maximum([-2, -7]) == -2",
     "def maximum(xs):\n    return max(xs)"),
    ("reverse_string", "reverse_string(s)", "returns the string s reversed",
     "assert reverse_string('abc') == 'cba'\nassert reverse_string('') == ''",
     "def reverse_string(s):\n    return s[::-1]"),
    ("count_vowels", "count_vowels(s)", "returns how many of the letters a, e, i, o, u "
     "(lower case) are in the string s",
     "assert count_vowels('hello') == 2\nassert count_vowels('xyz') == 0",
     "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)"),
    ("factorial", "factorial(n)", "returns n! for a non-negative integer n",
     "assert factorial(0) == 1\nassert factorial(5) == 120",
     "def factorial(n):\n    out = 1\n    for i in range(2, n + 1):\n"
     "        out *= i\n    return out"),
    ("fibonacci", "fibonacci(n)", "returns the n-th Fibonacci number, with fibonacci(0) == 0 "
     "and fibonacci(1) == 1",
     "assert fibonacci(0) == 0\nassert fibonacci(1) == 1\nassert fibonacci(10) == 55",
     "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
     "        a, b = b, a + b\n    return a"),
    ("is_palindrome", "is_palindrome(s)", "returns True if the string s reads the same "
     "backwards, else False",
     "assert is_palindrome('level')\nassert not is_palindrome('hello')\nassert is_palindrome('')",
     "def is_palindrome(s):\n    return s == s[::-1]"),
    ("sum_list", "sum_list(xs)", "returns the sum of the numbers in the list xs (0 if empty)",
     "assert sum_list([1, 2, 3]) == 6\nassert sum_list([]) == 0",
     "def sum_list(xs):\n    return sum(xs)"),
    ("average", "average(xs)", "returns the mean of the numbers in the non-empty list xs",
     "assert average([1, 2, 3]) == 2\nassert average([5]) == 5",
     "def average(xs):\n    return sum(xs) / len(xs)"),
    ("count_words", "count_words(s)", "returns the number of words in the string s, words "
     "being separated by spaces",
     "assert count_words('hello big world') == 3\nassert count_words('') == 0",
     "def count_words(s):\n    return len(s.split())"),
    ("celsius_to_fahrenheit", "celsius_to_fahrenheit(c)", "converts c degrees Celsius to "
     "Fahrenheit (c * 9 / 5 + 32)",
     "assert celsius_to_fahrenheit(0) == 32\nassert celsius_to_fahrenheit(100) == 212",
     "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32"),
    ("abs_value", "abs_value(x)", "returns the absolute value of the number x",
     "assert abs_value(-3) == 3\nassert abs_value(2) == 2",
     "def abs_value(x):\n    return -x if x < 0 else x"),
    ("min_of_three", "min_of_three(a, b, c)", "returns the smallest of the three numbers",
     "assert min_of_three(3, 1, 2) == 1\nassert min_of_three(5, 5, 9) == 5",
     "def min_of_three(a, b, c):\n    return min(a, b, c)"),
    ("count_char", "count_char(s, c)", "returns how many times the character c occurs in s",
     "assert count_char('banana', 'a') == 3\nassert count_char('abc', 'z') == 0",
     "def count_char(s, c):\n    return s.count(c)"),
    ("first_last", "first_last(xs)", "returns a tuple of the first and the last element of the "
     "non-empty list xs",
     "assert first_last([1, 2, 3]) == (1, 3)\nassert first_last([7]) == (7, 7)",
     "def first_last(xs):\n    return (xs[0], xs[-1])"),
    ("evens", "evens(xs)", "returns a list of the even numbers in xs, in order",
     "assert evens([1, 2, 3, 4]) == [2, 4]\nassert evens([1, 3]) == []",
     "def evens(xs):\n    return [x for x in xs if x % 2 == 0]"),
    ("double_all", "double_all(xs)", "returns a new list with every number in xs doubled",
     "assert double_all([1, 2]) == [2, 4]\nassert double_all([]) == []",
     "def double_all(xs):\n    return [2 * x for x in xs]"),
    ("is_prime", "is_prime(n)", "returns True if the integer n is a prime number, else False",
     "assert is_prime(2)\nassert is_prime(13)\nassert not is_prime(1)\nassert not is_prime(9)",
     "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
     "        if n % i == 0:\n            return False\n        i += 1\n    return True"),
    ("gcd", "gcd(a, b)", "returns the greatest common divisor of the positive integers a and b",
     "assert gcd(12, 18) == 6\nassert gcd(7, 5) == 1",
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"),
    ("digit_sum", "digit_sum(n)", "returns the sum of the decimal digits of the non-negative "
     "integer n",
     "assert digit_sum(123) == 6\nassert digit_sum(0) == 0",
     "def digit_sum(n):\n    return sum(int(d) for d in str(n))"),
    ("capitalize_words", "capitalize_words(s)", "returns s with the first letter of every "
     "space-separated word in upper case",
     "assert capitalize_words('hello world') == 'Hello World'\nassert capitalize_words('a') == 'A'",
     "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))"),
    ("unique", "unique(xs)", "returns the elements of xs without repeats, in the order they "
     "first appear",
     "assert unique([1, 2, 1, 3, 2]) == [1, 2, 3]\nassert unique([]) == []",
     "def unique(xs):\n    out = []\n    for x in xs:\n        if x not in out:\n"
     "            out.append(x)\n    return out"),
    ("power", "power(base, exp)", "returns base raised to the non-negative integer exp",
     "assert power(2, 10) == 1024\nassert power(5, 0) == 1",
     "def power(base, exp):\n    return base ** exp"),
    ("last_word", "last_word(s)", "returns the last space-separated word of the non-empty "
     "string s",
     "assert last_word('the quick fox') == 'fox'\nassert last_word('one') == 'one'",
     "def last_word(s):\n    return s.split()[-1]"),
    ("clamp", "clamp(x, lo, hi)", "returns x limited to the range lo..hi",
     "assert clamp(5, 0, 3) == 3\nassert clamp(-1, 0, 3) == 0\nassert clamp(2, 0, 3) == 2",
     "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))"),
    ("count_positive", "count_positive(xs)", "returns how many numbers in xs are greater "
     "than zero",
     "assert count_positive([1, -2, 3, 0]) == 2\nassert count_positive([]) == 0",
     "def count_positive(xs):\n    return sum(1 for x in xs if x > 0)"),
    ("join_words", "join_words(words)", "returns the strings in the list words joined by "
     "single spaces",
     "assert join_words(['a', 'b']) == 'a b'\nassert join_words([]) == ''",
     "def join_words(words):\n    return ' '.join(words)"),
    ("is_sorted", "is_sorted(xs)", "returns True if the list xs is in non-decreasing order",
     "assert is_sorted([1, 2, 2, 5])\nassert not is_sorted([3, 1])\nassert is_sorted([])",
     "def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))"),
]
# fmt: on


def tasks() -> list[dict[str, object]]:
    return [
        {
            "id": f"code-{i:03d}-{name}",
            "prompt": f"Write a Python function `{signature}` that {what}. {INSTRUCTION}",
            "metadata": {"tests": tests, "entry_point": name},
        }
        for i, (name, signature, what, tests, _) in enumerate(PROBLEMS)
    ]


def references() -> dict[str, str]:
    """Each task id's reference solution (for the tests; never in the task file)."""
    return {f"code-{i:03d}-{p[0]}": p[4] for i, p in enumerate(PROBLEMS)}


def jsonl(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def main() -> int:
    rows = tasks()
    (HERE / "code.jsonl").write_text(jsonl(rows), encoding="utf-8")
    print(f"wrote {len(rows)} tasks to {HERE / 'code.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
