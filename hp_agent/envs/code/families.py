"""Families of small programming problems, each a seeded generator of statement, reference
solution and test inputs (expected outputs are computed from the reference in
:mod:`hp_agent.envs.code.tasks`).

Five families are LeetCode-style functions (``functional``), five read stdin and print
(``stdin``). Within a family, level 1 is a one-line transform, level 2 needs a loop or a
condition, level 3 a few steps. Parameters (a divisor, a letter, a threshold) appear in
the statement, so one family yields many distinct problems.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

TESTS_PER_PROBLEM = 6
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_COMMON = "aabcdeeilnorst"  # inputs drawn mostly from few letters, so letter-specific problems bite
_NAMES = ("ana", "ben", "cai", "dev", "eli", "fay", "gus", "hal", "ida", "jon", "kim", "lea", "max", "nia", "oli")


@dataclass(frozen=True)
class Problem:
    """A generated problem before its expected outputs are known.

    statement: the task text; the split is decided on it (examples excluded).
    kind:      "functional" (call ``func_name`` on each input's arguments) or "stdin".
    solution:  the reference program (demonstrations and test checks only).
    inputs:    functional: one argument list per test; stdin: one stdin text per test.
    signature: functional: the ``def`` line given as starter code.
    """

    statement: str
    kind: str
    solution: str
    inputs: list
    func_name: str | None = None
    signature: str = ""


def _word(rng: random.Random, low: int = 0, high: int = 10, letters: str = _COMMON) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(low, high)))


def _numbers(rng: random.Random, low: int = -20, high: int = 50, longest: int = 9) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(0, longest))]


def _function(statement: str, signature: str, body: str, inputs: list) -> Problem:
    name = signature.split()[1].split("(")[0]
    return Problem(statement, "functional", f"{signature}\n    {body}\n", inputs, name, signature)


def _script(statement: str, solution: str, inputs: list[str]) -> Problem:
    return Problem(statement, "stdin", solution.strip() + "\n", inputs)


def _choose(rng: random.Random, variants: list[Callable[[], Problem]]) -> Problem:
    return rng.choice(variants)()


# ---- functional families ----------------------------------------------------------


def _strings(rng: random.Random, level: int) -> Problem:
    """``transform(s) -> str``: reverse, replace, remove, rotate, run-length encode..."""
    sig = "def transform(s: str) -> str:"
    args = [[_word(rng, 1)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[""]]  # the edge case stays private
    a, b = rng.sample(sorted(set(_COMMON)), 2)
    k = rng.randint(2, 5)
    suffix = _word(rng, 2, 4, _LETTERS)
    variants = {
        1: [lambda: _function("Return s reversed.", sig, "return s[::-1]", args),
            lambda: _function(f"Return s repeated {k} times.", sig, f"return s * {k}", args),
            lambda: _function(f"Return s with every '{a}' replaced by '{b}'.", sig, f"return s.replace({a!r}, {b!r})",
                              args),
            lambda: _function(f"Return s followed by '{suffix}'.", sig, f"return s + {suffix!r}", args),
            lambda: _function("Return s in upper case.", sig, "return s.upper()", args)],
        2: [lambda: _function(f"Return s with every '{a}' removed.", sig, f"return s.replace({a!r}, '')", args),
            lambda: _function(f"Return the characters of s at indices 0, {k}, {2 * k}, ... (every {k}th one).", sig,
                              f"return s[::{k}]", args),
            lambda: _function("Return s without its vowels (a, e, i, o, u).", sig,
                              "return ''.join(c for c in s if c not in 'aeiou')", args),
            lambda: _function(f"Return s rotated left by {k} characters ('abcdef' rotated by 2 is 'cdefab'); rotate "
                              f"by {k} modulo the length, and an empty s stays empty.", sig,
                              f"return s[{k} % len(s):] + s[:{k} % len(s)] if s else s", args),
            lambda: _function(f"Return s with every '{a}' doubled.", sig, f"return s.replace({a!r}, {2 * a!r})", args)],
        3: [lambda: _function("Return the run-length encoding of s: each run of one character becomes the character "
                              "and the run's length, e.g. 'aaabcc' -> 'a3b1c2'.", sig,
                              "out = ''\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and "
                              "s[j] == s[i]:\n            j += 1\n        out += s[i] + str(j - i)\n        i = j\n"
                              "    return out", args),
            lambda: _function(f"Shift every letter of s (all lowercase) {k} places forward in the alphabet, "
                              "wrapping from 'z' to 'a'.", sig,
                              f"return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) for c in s)", args),
            lambda: _function("Return s with each run of a repeated character collapsed to one, e.g. 'aabccc' -> "
                              "'abc'.", sig, "return ''.join(c for i, c in enumerate(s) if i == 0 or s[i - 1] != c)",
                              args),
            lambda: _function(f"Return s with its characters sorted, keeping only the first {k} of them.", sig,
                              f"return ''.join(sorted(s))[:{k}]", args)],
    }
    return _choose(rng, variants[level])


def _integers(rng: random.Random, level: int) -> Problem:
    """``compute(n) -> int``: linear maps, digit sums, divisor counts, recurrences..."""
    sig = "def compute(n: int) -> int:"
    a, b = rng.randint(2, 9), rng.randint(1, 30)
    c = rng.choice([x for x in range(2, 10) if x != a])
    args = [[n] for n in rng.sample(range(0 if level > 1 else -30, 200), TESTS_PER_PROBLEM)]
    positive = [[n] for n in rng.sample(range(1, 120), TESTS_PER_PROBLEM)]
    variants = {
        1: [lambda: _function(f"Return n * {a} + {b}.", sig, f"return n * {a} + {b}", args),
            lambda: _function(f"Return n squared minus {b}.", sig, f"return n * n - {b}", args),
            lambda: _function(f"Return the remainder of n divided by {a} (Python's n % {a}).", sig, f"return n % {a}",
                              args),
            lambda: _function(f"Return n divided by {a}, rounded down.", sig, f"return n // {a}", args)],
        2: [lambda: _function(f"Return the sum of the decimal digits of n (n >= 0) times {a}.", sig,
                              f"return sum(int(d) for d in str(n)) * {a}", args),
            lambda: _function(f"Return how many integers from 1 to n are divisible by {a}.", sig,
                              f"return sum(1 for i in range(1, n + 1) if i % {a} == 0)", args),
            lambda: _function(f"Return the sum of the integers from 1 to n that are divisible by {a} or {c}.", sig,
                              f"return sum(i for i in range(1, n + 1) if i % {a} == 0 or i % {c} == 0)", args),
            lambda: _function(f"Return how many times the digit {a} occurs in n (n >= 0).", sig,
                              f"return str(n).count('{a}')", args)],
        3: [lambda: _function(f"Return the number of divisors of n (n >= 1) that are greater than {a}.", sig,
                              f"return sum(1 for d in range(1, n + 1) if n % d == 0 and d > {a})", positive),
            lambda: _function(f"Let f(0) = {a}, f(1) = {b} and f(i) = f(i - 1) + f(i - 2). Return f(n) (n >= 0).", sig,
                              f"x, y = {a}, {b}\n    for _ in range(n):\n        x, y = y, x + y\n    return x", args),
            lambda: _function(f"Return the smallest integer m >= n divisible by both {a} and {c}.", sig,
                              f"m = n\n    while m % {a} or m % {c}:\n        m += 1\n    return m", args),
            lambda: _function(f"Return how many times n (n >= 0) must be divided by {a}, rounding down, to reach 0.",
                              sig, f"steps = 0\n    while n:\n        n //= {a}\n        steps += 1\n    return steps",
                              args)],
    }
    return _choose(rng, variants[level])


def _lists(rng: random.Random, level: int) -> Problem:
    """``aggregate(nums) -> int``: filtered sums, counts, windows, runs."""
    sig = "def aggregate(nums: list[int]) -> int:"
    args = [[_numbers(rng)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[[]]]  # the edge case stays private
    t, k, m = rng.randint(-5, 30), rng.randint(2, 6), rng.choice((7, 11, 13, 97, 101))
    variants = {
        1: [lambda: _function(f"Return the sum of the elements greater than {t}.", sig,
                              f"return sum(x for x in nums if x > {t})", args),
            lambda: _function(f"Return how many elements are divisible by {k}.", sig,
                              f"return sum(1 for x in nums if x % {k} == 0)", args),
            lambda: _function(f"Return the sum of the elements at even indices times {k}.", sig,
                              f"return sum(nums[::2]) * {k}", args),
            lambda: _function(f"Return the sum of all elements plus {t}.", sig, f"return sum(nums) + {t}", args)],
        2: [lambda: _function(f"Return the number of adjacent pairs nums[i], nums[i + 1] whose sum is "
                              f"greater than {t}.",
                              sig, f"return sum(1 for x, y in zip(nums, nums[1:]) if x + y > {t})", args),
            lambda: _function(f"Return the largest element minus the smallest, or {t} for an empty list.", sig,
                              f"return max(nums) - min(nums) if nums else {t}", args),
            lambda: _function(f"Return the product of the elements modulo {m} (1 for an empty list, before "
                              "the modulo).",
                              sig, f"p = 1\n    for x in nums:\n        p = p * x % {m}\n    return p % {m}", args),
            lambda: _function(f"Return the sum of the squares of the elements smaller than {t}.", sig,
                              f"return sum(x * x for x in nums if x < {t})", args)],
        3: [lambda: _function(f"Return the length of the longest run of consecutive strictly increasing elements "
                              f"times {k} (0 for an empty list).", sig,
                              "best = run = 0\n    for i, x in enumerate(nums):\n        run = run + 1 if i and x > "
                              f"nums[i - 1] else 1\n        best = max(best, run)\n    return best * {k}", args),
            lambda: _function(f"Return the largest sum of {k} consecutive elements (0 if there are fewer than {k}).",
                              sig, f"if len(nums) < {k}:\n        return 0\n    return max(sum(nums[i:i + {k}]) "
                              f"for i in range(len(nums) - {k} + 1))", args),
            lambda: _function(f"Return how many distinct values x with x > {t} appear in nums.", sig,
                              f"return len({{x for x in nums if x > {t}}})", args),
            lambda: _function(f"Return the sum of the elements whose index is divisible by {k} minus the sum of the "
                              "others.", sig, f"return sum(x if i % {k} == 0 else -x for i, x in enumerate(nums))",
                              args)],
    }
    return _choose(rng, variants[level])


def _list_ops(rng: random.Random, level: int) -> Problem:
    """``transform_list(nums) -> list[int]``: maps, filters, rotations, windows."""
    sig = "def transform_list(nums: list[int]) -> list[int]:"
    args = [[_numbers(rng)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[[]]]  # the edge case stays private
    t, k = rng.randint(-5, 30), rng.randint(2, 6)
    r = rng.randrange(k)
    order = rng.choice(("ascending", "descending"))
    variants = {
        1: [lambda: _function(f"Return the list with every element multiplied by {k}.", sig,
                              f"return [x * {k} for x in nums]", args),
            lambda: _function(f"Return the elements greater than {t}, in their original order.", sig,
                              f"return [x for x in nums if x > {t}]", args),
            lambda: _function(f"Return the elements sorted in {order} order.", sig,
                              f"return sorted(nums{', reverse=True' if order == 'descending' else ''})", args),
            lambda: _function(f"Return the list with {t} added to every element.", sig,
                              f"return [x + {t} for x in nums]", args)],
        2: [lambda: _function(f"Return the list rotated left by {k} positions (by {k} modulo the length; an empty "
                              "list stays empty).", sig,
                              f"if not nums:\n        return []\n    s = {k} % len(nums)\n"
                              "    return nums[s:] + nums[:s]",
                              args),
            lambda: _function(f"Return the running sums of the list, each plus {t}: element i is nums[0] + ... + "
                              f"nums[i] + {t}.", sig,
                              f"out, total = [], 0\n    for x in nums:\n        total += x\n"
                              f"        out.append(total + {t})"
                              "\n    return out", args),
            lambda: _function(f"Return, sorted ascending, the elements whose remainder modulo {k} is {r}.", sig,
                              f"return sorted(x for x in nums if x % {k} == {r})", args),
            lambda: _function(f"Return the elements at indices 0, {k}, {2 * k}, ... in reverse order.", sig,
                              f"return nums[::{k}][::-1]", args)],
        3: [lambda: _function(f"Return the sums of every window of {k} consecutive elements, from left to right.", sig,
                              f"return [sum(nums[i:i + {k}]) for i in range(len(nums) - {k} + 1)]", args),
            lambda: _function(f"Return the list with the multiples of {k} moved to the front, keeping the relative "
                              "order within both groups.", sig,
                              f"return [x for x in nums if x % {k} == 0] + [x for x in nums if x % {k}]", args),
            lambda: _function(f"Remove repeated values (keep first occurrences), then sort by x % {k} and, on ties, "
                              "by x.", sig,
                              f"seen = []\n    for x in nums:\n        if x not in seen:\n            seen.append(x)\n"
                              f"    return sorted(seen, key=lambda x: (x % {k}, x))", args),
            lambda: _function(f"Return the differences nums[i + 1] - nums[i], each multiplied by {k}.", sig,
                              f"return [(y - x) * {k} for x, y in zip(nums, nums[1:])]", args)],
    }
    return _choose(rng, variants[level])


def _predicates(rng: random.Random, level: int) -> Problem:
    """``check(...) -> bool``: membership, palindromes, divisibility, brackets."""
    sig_s, sig_n = "def check(s: str) -> bool:", "def check(n: int) -> bool:"
    c = rng.choice(_COMMON)
    k = rng.randint(2, 5)
    a, b = rng.sample(range(2, 10), 2)
    prefix = _word(rng, 1, 2)
    words = [[_word(rng, 0, 8)] for _ in range(TESTS_PER_PROBLEM)]
    words[1] = [prefix + _word(rng, 0, 4) + c]  # at least one input says True for each level-1 check
    palindromes = [[w[0] + w[0][::-1][1:]] if i % 2 else w for i, w in enumerate(words)]
    numbers = [[n] for n in rng.sample(range(1, 400), TESTS_PER_PROBLEM - 1)] + [[a * 7]]
    pair = rng.choice(("()[]", "(){}", "()<>", "[]{}"))
    brackets = [["".join(rng.choice(pair) for _ in range(rng.randint(0, 8)))] for _ in range(TESTS_PER_PROBLEM)]
    brackets[1], brackets[2] = [pair[0] + pair[2] + pair[3] + pair[1]], [pair[0] + pair[1] + pair[2] + pair[3]]
    bracket_body = ("stack = []\n    for ch in s:\n        if ch in " + repr(pair[0] + pair[2]) + ":\n            "
                    "stack.append(ch)\n        elif not stack or " + repr(pair[0] + pair[2]) + ".index(stack.pop()) != "
                    + repr(pair[1] + pair[3]) + ".index(ch):\n            return False\n    return not stack")
    variants = {
        1: [lambda: _function(f"Return True if s contains the letter '{c}', else False.", sig_s, f"return {c!r} in s",
                              words),
            lambda: _function(f"Return True if s starts with '{prefix}', else False.", sig_s,
                              f"return s.startswith({prefix!r})", words),
            lambda: _function(f"Return True if s is longer than {k} characters, else False.", sig_s,
                              f"return len(s) > {k}", words)],
        2: [lambda: _function(f"Return True if s reads the same backwards once every '{c}' is removed.", sig_s,
                              f"t = s.replace({c!r}, '')\n    return t == t[::-1]", palindromes),
            lambda: _function(f"Return True if n is divisible by {a} but not by {b}.", sig_n,
                              f"return n % {a} == 0 and n % {b} != 0", numbers),
            lambda: _function(f"Return True if no character occurs in s more than {k - 1} times.", sig_s,
                              f"return all(s.count(ch) < {k} for ch in s)", words)],
        3: [lambda: _function(f"s holds only the characters {' '.join(pair)}. Return True if its brackets are "
                              f"balanced: {pair[:2]} and {pair[2:]} pairs, properly nested.", sig_s, bracket_body,
                              brackets),
            lambda: _function(f"Return True if the digits of n add up to a multiple of {a}.", sig_n,
                              f"return sum(int(d) for d in str(n)) % {a} == 0", numbers),
            lambda: _function(f"Return True if s contains '{c}' exactly {k - 1} times and is not a palindrome.", sig_s,
                              f"return s.count({c!r}) == {k - 1} and s != s[::-1]", palindromes)],
    }
    return _choose(rng, variants[level])


# ---- stdin families ---------------------------------------------------------------


def _pairs(rng: random.Random, level: int) -> Problem:
    """Two integers a b on one line; print a function of them."""
    head = "The input is one line with two integers a and b (a <= b). "
    k, d = rng.randint(2, 9), rng.randint(0, 9)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        a = rng.randint(-20, 60)
        inputs.append(f"{a} {a + rng.randint(0, 40)}\n")
    read = "a, b = map(int, input().split())\n"
    variants = {
        1: [lambda: _script(head + f"Print a * {k} + b.", read + f"print(a * {k} + b)", inputs),
            lambda: _script(head + f"Print b - a + {k}.", read + f"print(b - a + {k})", inputs),
            lambda: _script(head + f"Print a * b - {k}.", read + f"print(a * b - {k})", inputs),
            lambda: _script(head + f"Print a + b, then a * {k} on the next line.",
                            read + f"print(a + b)\nprint(a * {k})",
                            inputs)],
        2: [lambda: _script(head + f"Print the sum of the integers from a to b inclusive that are divisible by {k}.",
                            read + f"print(sum(x for x in range(a, b + 1) if x % {k} == 0))", inputs),
            lambda: _script(head + f"Print how many integers from a to b inclusive end in the digit {d}.",
                            read + f"print(sum(1 for x in range(a, b + 1) if abs(x) % 10 == {d}))", inputs),
            lambda: _script(head + f"Print the larger of a * {k} and b.", read + f"print(max(a * {k}, b))", inputs)],
        3: [lambda: _script(head + f"Print the multiples of {k} from a to b inclusive on one line, "
                            "separated by spaces, "
                            "or -1 if there are none.",
                            read + f"found = [str(x) for x in range(a, b + 1) if x % {k} == 0]\n"
                            "print(' '.join(found) if found else -1)", inputs),
            lambda: _script(head + f"Print each integer x from a to b inclusive with x % {k} == {d % k} "
                            "on its own line, "
                            "then the count of them.",
                            read + f"found = [x for x in range(a, b + 1) if x % {k} == {d % k}]\nfor x in found:\n"
                            "    print(x)\nprint(len(found))", inputs)],
    }
    return _choose(rng, variants[level])


def _numbers_stdin(rng: random.Random, level: int) -> Problem:
    """n, then n integers on the next line; print an aggregate."""
    head = "The first line holds n (n >= 1); the second line holds n integers separated by spaces. "
    t, k = rng.randint(-5, 30), rng.randint(2, 6)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        values = [rng.randint(-20, 50) for _ in range(rng.randint(1, 9))]
        inputs.append(f"{len(values)}\n{' '.join(map(str, values))}\n")
    read = "n = int(input())\nnums = list(map(int, input().split()))\n"
    variants = {
        1: [lambda: _script(head + f"Print the sum of the numbers greater than {t}.",
                            read + f"print(sum(x for x in nums if x > {t}))", inputs),
            lambda: _script(head + f"Print the largest number plus {t}.", read + f"print(max(nums) + {t})", inputs),
            lambda: _script(head + f"Print how many numbers are divisible by {k}.",
                            read + f"print(sum(1 for x in nums if x % {k} == 0))", inputs)],
        2: [lambda: _script(head + f"Print the numbers greater than {t} in descending order, separated by spaces (an "
                            "empty line if none).",
                            read + f"print(' '.join(map(str, sorted((x for x in nums if x > {t}), reverse=True))))",
                            inputs),
            lambda: _script(head + f"Print how many numbers are greater than the number just before them, plus {k}.",
                            read + f"print(sum(1 for i in range(1, n) if nums[i] > nums[i - 1]) + {k})", inputs),
            lambda: _script(head + f"Print the sum of the numbers divided by {k}, rounded down.",
                            read + f"print(sum(nums) // {k})", inputs)],
        3: [lambda: _script(head + f"Print three lines: the smallest number, the largest, and how many numbers are "
                            f"at least {t}.",
                            read + f"print(min(nums))\nprint(max(nums))\nprint(sum(1 for x in nums if x >= {t}))",
                            inputs),
            lambda: _script(head + f"Print the running maximum of the numbers times {k}, separated by spaces.",
                            read + f"best = nums[0]\nout = []\nfor x in nums:\n    best = max(best, x)\n"
                            f"    out.append(best * {k})\nprint(' '.join(map(str, out)))", inputs),
            lambda: _script(head + f"Print the numbers at positions {k}, {2 * k}, ... (counting from 1) on one line, "
                            "or NONE if there are none.",
                            read + f"picked = nums[{k - 1}::{k}]\n"
                            "print(' '.join(map(str, picked)) if picked else 'NONE')",
                            inputs)],
    }
    return _choose(rng, variants[level])


def _text(rng: random.Random, level: int) -> Problem:
    """One line of lowercase words; print a transform or a count."""
    head = "The input is one line of lowercase words separated by single spaces. "
    c, k = rng.choice(_COMMON), rng.randint(2, 5)
    inputs = [" ".join(_word(rng, 1, 6) for _ in range(rng.randint(1, 6))) + "\n" for _ in range(TESTS_PER_PROBLEM)]
    variants = {
        1: [lambda: _script(head + "Print the line reversed.", "print(input()[::-1])", inputs),
            lambda: _script(head + f"Print how many times the letter '{c}' occurs.", f"print(input().count({c!r}))",
                            inputs),
            lambda: _script(head + f"Print the line with every '{c}' replaced by '*'.",
                            f"print(input().replace({c!r}, '*'))", inputs)],
        2: [lambda: _script(head + "Print the words in reverse order, separated by single spaces.",
                            "print(' '.join(input().split()[::-1]))", inputs),
            lambda: _script(head + f"Print how many words are longer than {k} letters.",
                            f"print(sum(1 for w in input().split() if len(w) > {k}))", inputs),
            lambda: _script(head + f"Print the words that contain '{c}', one per line.",
                            f"for w in input().split():\n    if {c!r} in w:\n        print(w)", inputs)],
        3: [lambda: _script(head + f"For each distinct word with at least {k - 1} letters, in order of "
                            "first appearance, "
                            "print the word and how many times it occurs, separated by a space.",
                            "words = input().split()\nseen = []\nfor w in words:\n"
                            f"    if len(w) >= {k - 1} and w not in seen:\n        seen.append(w)\n"
                            "        print(w, words.count(w))", inputs),
            lambda: _script(head + f"Print the longest word (the first one on ties) followed by '{c * 2}'.",
                            "best = ''\nfor w in input().split():\n    if len(w) > len(best):\n        best = w\n"
                            f"print(best + {c * 2!r})", inputs),
            lambda: _script(head + f"Print the words sorted by length and then alphabetically, keeping only words "
                            f"without '{c}', separated by spaces.",
                            f"words = [w for w in input().split() if {c!r} not in w]\n"
                            "print(' '.join(sorted(words, key=lambda w: (len(w), w))))", inputs)],
    }
    return _choose(rng, variants[level])


def _records(rng: random.Random, level: int) -> Problem:
    """n lines of "name score"; print a query over them."""
    head = ("The first line holds n (n >= 1). Each of the next n lines holds a name and an integer score, separated by "
            "a space. ")
    t, k = rng.randint(20, 80), rng.randint(1, 3)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        names = rng.sample(_NAMES, rng.randint(1, 6))
        inputs.append(f"{len(names)}\n" + "".join(f"{name} {rng.randint(0, 100)}\n" for name in names))
    read = ("n = int(input())\nrows = []\nfor _ in range(n):\n    name, score = input().split()\n"
            "    rows.append((name, int(score)))\n")
    variants = {
        1: [lambda: _script(head + "Print the name with the highest score (the first one on ties).",
                            read + "best = rows[0]\nfor row in rows:\n    if row[1] > best[1]:\n        best = row\n"
                            "print(best[0])", inputs),
            lambda: _script(head + f"Print how many people scored at least {t}.",
                            read + f"print(sum(1 for _, s in rows if s >= {t}))", inputs),
            lambda: _script(head + f"Print the total of all scores plus {t}.",
                            read + f"print(sum(s for _, s in rows) + {t})",
                            inputs)],
        2: [lambda: _script(head + f"Print the names of those who scored at least {t}, one per line in input order, or "
                            "NONE if nobody did.",
                            read + f"names = [name for name, s in rows if s >= {t}]\nprint('\\n'.join(names) if names "
                            "else 'NONE')", inputs),
            lambda: _script(head + f"Print the lowest score and the name that has it (the first one on ties), "
                            f"with the score raised by {t}.",
                            read + "low = rows[0]\nfor row in rows:\n    if row[1] < low[1]:\n        low = row\n"
                            f"print(low[1] + {t}, low[0])", inputs)],
        3: [lambda: _script(head + "Print the rows sorted by score from high to low, ties by name, as 'name score' "
                            f"lines, keeping only the first {k + 1} rows.",
                            read + "rows.sort(key=lambda row: (-row[1], row[0]))\n"
                            f"for name, s in rows[:{k + 1}]:\n    print(name, s)", inputs),
            lambda: _script(head + f"Print the names whose score is within {t // 4} of the highest score, in "
                            "alphabetical order, separated by spaces.",
                            read + f"top = max(s for _, s in rows)\nprint(' '.join(sorted(name for name, s in rows if "
                            f"top - s <= {t // 4})))", inputs)],
    }
    return _choose(rng, variants[level])


def _patterns(rng: random.Random, level: int) -> Problem:
    """One integer n; print a sequence, a shape or FizzBuzz-like lines."""
    head = "The input is one integer n (n >= 1). "
    k, a, b = rng.randint(2, 9), *rng.sample(range(2, 8), 2)
    ch = rng.choice("*#+@")
    w1, w2 = rng.sample(("fizz", "buzz", "ping", "pong", "zip", "zap", "foo", "bar"), 2)
    inputs = [f"{n}\n" for n in rng.sample(range(1, 16), TESTS_PER_PROBLEM)]
    read = "n = int(input())\n"
    variants = {
        1: [lambda: _script(head + f"Print the first n multiples of {k} (starting with {k}), separated by spaces.",
                            read + f"print(' '.join(str({k} * i) for i in range(1, n + 1)))", inputs),
            lambda: _script(head + f"Print a line of n '{ch}' characters.", read + f"print({ch!r} * n)", inputs),
            lambda: _script(head + f"Print n * {k} and then n + {k}, on two lines.",
                            read + f"print(n * {k})\nprint(n + {k})",
                            inputs)],
        2: [lambda: _script(head + f"Print a right triangle of '{ch}' with n rows: row i has i characters.",
                            read + f"for i in range(1, n + 1):\n    print({ch!r} * i)", inputs),
            lambda: _script(head + f"Print the numbers from 1 to n that are not divisible by {k}, separated by spaces.",
                            read + f"print(' '.join(str(i) for i in range(1, n + 1) if i % {k}))", inputs),
            lambda: _script(head + f"Print the numbers from n down to 1 in steps of {k}, one per line.",
                            read + f"for i in range(n, 0, -{k}):\n    print(i)", inputs)],
        3: [lambda: _script(head + f"For i from 1 to n print a line: '{w1}{w2}' if i is divisible by both {a} and {b}, "
                            f"'{w1}' if only by {a}, '{w2}' if only by {b}, else i.",
                            read + f"for i in range(1, n + 1):\n    if i % {a} == 0 and i % {b} == 0:\n"
                            f"        print({w1 + w2!r})\n    elif i % {a} == 0:\n        print({w1!r})\n"
                            f"    elif i % {b} == 0:\n        print({w2!r})\n    else:\n        print(i)", inputs),
            lambda: _script(head + f"Print an n by n grid: the cell in row i and column j (from 0) is '{ch}' if "
                            f"(i + j) % {k} == 0, else '.'.",
                            read + f"for i in range(n):\n    print(''.join({ch!r} if (i + j) % {k} == 0 else '.' "
                            "for j in "
                            "range(n)))", inputs)],
    }
    return _choose(rng, variants[level])


# Family (the task_type of generated tasks) -> generator(rng, level 1..3).
FAMILIES: dict[str, Callable[[random.Random, int], Problem]] = {
    "strings": _strings, "integers": _integers, "lists": _lists, "list_ops": _list_ops, "predicates": _predicates,
    "pairs": _pairs, "numbers": _numbers_stdin, "text": _text, "records": _records, "patterns": _patterns,
}
