"""Stdin families: the program reads standard input and prints. A family's input-reading
lines open every program; each reference's positional parameters are what those lines
bind, its docstring the rest of the statement, its keyword-only parameters the drawn
values (see :mod:`.reference`). The tables list references by level, in draw order.
"""

from __future__ import annotations

import random

from hp_agent.envs.code.families.reference import COMMON, TESTS_PER_PROBLEM, stdin_problem, word
from hp_agent.envs.generated import Family, Problem

_NAMES = ("ana", "ben", "cai", "dev", "eli", "fay", "gus", "hal", "ida", "jon", "kim", "lea", "max", "nia", "oli")

# ---- pairs: "a b" ---------------------------------------------------------------------


def _pair_affine(a: int, b: int, *, k: int) -> None:
    """Print a * {k} + b."""
    print(a * k + b)


def _pair_gap(a: int, b: int, *, k: int) -> None:
    """Print b - a + {k}."""
    print(b - a + k)


def _pair_product(a: int, b: int, *, k: int) -> None:
    """Print a * b - {k}."""
    print(a * b - k)


def _pair_two_lines(a: int, b: int, *, k: int) -> None:
    """Print a + b, then a * {k} on the next line."""
    print(a + b)
    print(a * k)


def _range_multiples_sum(a: int, b: int, *, k: int) -> None:
    """Print the sum of the integers from a to b inclusive that are divisible by {k}."""
    print(sum(x for x in range(a, b + 1) if x % k == 0))


def _range_last_digit(a: int, b: int, *, d: int) -> None:
    """Print how many integers from a to b inclusive end in the digit {d}."""
    print(sum(1 for x in range(a, b + 1) if abs(x) % 10 == d))


def _pair_larger(a: int, b: int, *, k: int) -> None:
    """Print the larger of a * {k} and b."""
    print(max(a * k, b))


def _range_multiples(a: int, b: int, *, k: int) -> None:
    """Print the multiples of {k} from a to b inclusive on one line, separated by spaces, or -1 if there are none."""
    found = [str(x) for x in range(a, b + 1) if x % k == 0]
    print(' '.join(found) if found else -1)


def _range_residues(a: int, b: int, *, k: int, r: int) -> None:
    """Print each integer x from a to b inclusive with x % {k} == {r} on its own line, then the count of them."""
    found = [x for x in range(a, b + 1) if x % k == r]
    for x in found:
        print(x)
    print(len(found))


_PAIRS = {1: (_pair_affine, _pair_gap, _pair_product, _pair_two_lines),
          2: (_range_multiples_sum, _range_last_digit, _pair_larger),
          3: (_range_multiples, _range_residues)}


def _pairs(rng: random.Random, level: int) -> Problem:
    """Two integers a b on one line; print a function of them."""
    k, d = rng.randint(2, 9), rng.randint(0, 9)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        a = rng.randint(-20, 60)
        inputs.append(f"{a} {a + rng.randint(0, 40)}\n")
    return stdin_problem("The input is one line with two integers a and b (a <= b). ",
                         "a, b = map(int, input().split())\n", rng.choice(_PAIRS[level]), inputs, k=k, d=d, r=d % k)


# ---- numbers: "n", then n integers ------------------------------------------------------


def _numbers_sum_above(n: int, nums: list[int], *, t: int) -> None:
    """Print the sum of the numbers greater than {t}."""
    print(sum(x for x in nums if x > t))


def _numbers_max_plus(n: int, nums: list[int], *, t: int) -> None:
    """Print the largest number plus {t}."""
    print(max(nums) + t)


def _numbers_divisible(n: int, nums: list[int], *, k: int) -> None:
    """Print how many numbers are divisible by {k}."""
    print(sum(1 for x in nums if x % k == 0))


def _numbers_above_descending(n: int, nums: list[int], *, t: int) -> None:
    """Print the numbers greater than {t} in descending order, separated by spaces (an empty line if none)."""
    print(' '.join(map(str, sorted((x for x in nums if x > t), reverse=True))))


def _numbers_rises(n: int, nums: list[int], *, k: int) -> None:
    """Print how many numbers are greater than the number just before them, plus {k}."""
    print(sum(1 for i in range(1, n) if nums[i] > nums[i - 1]) + k)


def _numbers_sum_divided(n: int, nums: list[int], *, k: int) -> None:
    """Print the sum of the numbers divided by {k}, rounded down."""
    print(sum(nums) // k)


def _numbers_summary(n: int, nums: list[int], *, t: int) -> None:
    """Print three lines: the smallest number, the largest, and how many numbers are at least {t}."""
    print(min(nums))
    print(max(nums))
    print(sum(1 for x in nums if x >= t))


def _numbers_running_max(n: int, nums: list[int], *, k: int) -> None:
    """Print the running maximum of the numbers times {k}, separated by spaces."""
    best = nums[0]
    out = []
    for x in nums:
        best = max(best, x)
        out.append(best * k)
    print(' '.join(map(str, out)))


def _numbers_every_kth(n: int, nums: list[int], *, k: int, start: int) -> None:
    """Print the numbers at positions {k}, {k2}, ... (counting from 1) on one line, or NONE if there are none."""
    picked = nums[start::k]
    print(' '.join(map(str, picked)) if picked else 'NONE')


_NUMBERS = {1: (_numbers_sum_above, _numbers_max_plus, _numbers_divisible),
            2: (_numbers_above_descending, _numbers_rises, _numbers_sum_divided),
            3: (_numbers_summary, _numbers_running_max, _numbers_every_kth)}


def _numbers(rng: random.Random, level: int) -> Problem:
    """n, then n integers on the next line; print an aggregate."""
    t, k = rng.randint(-5, 30), rng.randint(2, 6)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        values = [rng.randint(-20, 50) for _ in range(rng.randint(1, 9))]
        inputs.append(f"{len(values)}\n{' '.join(map(str, values))}\n")
    return stdin_problem("The first line holds n (n >= 1); the second line holds n integers separated by spaces. ",
                         "n = int(input())\nnums = list(map(int, input().split()))\n", rng.choice(_NUMBERS[level]),
                         inputs, t=t, k=k, k2=2 * k, start=k - 1)


# ---- text: one line of words -------------------------------------------------------------


def _line_reversed() -> None:
    """Print the line reversed."""
    print(input()[::-1])


def _letter_count(*, c: str) -> None:
    """Print how many times the letter '{c}' occurs."""
    print(input().count(c))


def _letter_masked(*, c: str) -> None:
    """Print the line with every '{c}' replaced by '*'."""
    print(input().replace(c, '*'))


def _words_reversed() -> None:
    """Print the words in reverse order, separated by single spaces."""
    print(' '.join(input().split()[::-1]))


def _long_words(*, k: int) -> None:
    """Print how many words are longer than {k} letters."""
    print(sum(1 for w in input().split() if len(w) > k))


def _words_with_letter(*, c: str) -> None:
    """Print the words that contain '{c}', one per line."""
    for w in input().split():
        if c in w:
            print(w)


def _word_counts(*, shortest: int) -> None:
    """For each distinct word with at least {shortest} letters, in order of first appearance, print the word and
    how many times it occurs, separated by a space."""
    words = input().split()
    seen = []
    for w in words:
        if len(w) >= shortest and w not in seen:
            seen.append(w)
            print(w, words.count(w))


def _longest_word(*, cc: str) -> None:
    """Print the longest word (the first one on ties) followed by '{cc}'."""
    best = ''
    for w in input().split():
        if len(w) > len(best):
            best = w
    print(best + cc)


def _words_by_length(*, c: str) -> None:
    """Print the words sorted by length and then alphabetically, keeping only words without '{c}', separated by
    spaces."""
    words = [w for w in input().split() if c not in w]
    print(' '.join(sorted(words, key=lambda w: (len(w), w))))


_TEXT = {1: (_line_reversed, _letter_count, _letter_masked),
         2: (_words_reversed, _long_words, _words_with_letter),
         3: (_word_counts, _longest_word, _words_by_length)}


def _text(rng: random.Random, level: int) -> Problem:
    """One line of lowercase words; print a transform or a count."""
    c, k = rng.choice(COMMON), rng.randint(2, 5)
    inputs = [" ".join(word(rng, 1, 6) for _ in range(rng.randint(1, 6))) + "\n" for _ in range(TESTS_PER_PROBLEM)]
    return stdin_problem("The input is one line of lowercase words separated by single spaces. ", "",
                         rng.choice(_TEXT[level]), inputs, c=c, k=k, shortest=k - 1, cc=c * 2)


# ---- records: "n", then n lines "name score" -------------------------------------------


def _top_scorer(rows: list[tuple[str, int]]) -> None:
    """Print the name with the highest score (the first one on ties)."""
    best = rows[0]
    for row in rows:
        if row[1] > best[1]:
            best = row
    print(best[0])


def _count_at_least(rows: list[tuple[str, int]], *, t: int) -> None:
    """Print how many people scored at least {t}."""
    print(sum(1 for _, s in rows if s >= t))


def _total_plus(rows: list[tuple[str, int]], *, t: int) -> None:
    """Print the total of all scores plus {t}."""
    print(sum(s for _, s in rows) + t)


def _names_at_least(rows: list[tuple[str, int]], *, t: int) -> None:
    """Print the names of those who scored at least {t}, one per line in input order, or NONE if nobody did."""
    names = [name for name, s in rows if s >= t]
    print('\n'.join(names) if names else 'NONE')


def _lowest_raised(rows: list[tuple[str, int]], *, t: int) -> None:
    """Print the lowest score and the name that has it (the first one on ties), with the score raised by {t}."""
    low = rows[0]
    for row in rows:
        if row[1] < low[1]:
            low = row
    print(low[1] + t, low[0])


def _leaderboard(rows: list[tuple[str, int]], *, kept: int) -> None:
    """Print the rows sorted by score from high to low, ties by name, as 'name score' lines, keeping only the first
    {kept} rows."""
    rows.sort(key=lambda row: (-row[1], row[0]))
    for name, s in rows[:kept]:
        print(name, s)


def _near_top(rows: list[tuple[str, int]], *, margin: int) -> None:
    """Print the names whose score is within {margin} of the highest score, in alphabetical order, separated by
    spaces."""
    top = max(s for _, s in rows)
    print(' '.join(sorted(name for name, s in rows if top - s <= margin)))


_RECORDS = {1: (_top_scorer, _count_at_least, _total_plus),
            2: (_names_at_least, _lowest_raised),
            3: (_leaderboard, _near_top)}


def _records(rng: random.Random, level: int) -> Problem:
    """n lines of "name score"; print a query over them."""
    t, k = rng.randint(20, 80), rng.randint(1, 3)
    inputs = []
    for _ in range(TESTS_PER_PROBLEM):
        names = rng.sample(_NAMES, rng.randint(1, 6))
        inputs.append(f"{len(names)}\n" + "".join(f"{name} {rng.randint(0, 100)}\n" for name in names))
    head = ("The first line holds n (n >= 1). Each of the next n lines holds a name and an integer score, separated by "
            "a space. ")
    read = ("n = int(input())\nrows = []\nfor _ in range(n):\n    name, score = input().split()\n"
            "    rows.append((name, int(score)))\n")
    return stdin_problem(head, read, rng.choice(_RECORDS[level]), inputs, t=t, kept=k + 1, margin=t // 4)


# ---- patterns: one integer n -----------------------------------------------------------


def _multiples(n: int, *, k: int) -> None:
    """Print the first n multiples of {k} (starting with {k}), separated by spaces."""
    print(' '.join(str(k * i) for i in range(1, n + 1)))


def _character_line(n: int, *, ch: str) -> None:
    """Print a line of n '{ch}' characters."""
    print(ch * n)


def _two_values(n: int, *, k: int) -> None:
    """Print n * {k} and then n + {k}, on two lines."""
    print(n * k)
    print(n + k)


def _triangle(n: int, *, ch: str) -> None:
    """Print a right triangle of '{ch}' with n rows: row i has i characters."""
    for i in range(1, n + 1):
        print(ch * i)


def _not_divisible(n: int, *, k: int) -> None:
    """Print the numbers from 1 to n that are not divisible by {k}, separated by spaces."""
    print(' '.join(str(i) for i in range(1, n + 1) if i % k))


def _countdown(n: int, *, k: int) -> None:
    """Print the numbers from n down to 1 in steps of {k}, one per line."""
    for i in range(n, 0, -k):
        print(i)


def _fizzbuzz(n: int, *, a: int, b: int, w1: str, w2: str, both: str) -> None:
    """For i from 1 to n print a line: '{w1}{w2}' if i is divisible by both {a} and {b}, '{w1}' if only by {a},
    '{w2}' if only by {b}, else i."""
    for i in range(1, n + 1):
        if i % a == 0 and i % b == 0:
            print(both)
        elif i % a == 0:
            print(w1)
        elif i % b == 0:
            print(w2)
        else:
            print(i)


def _grid(n: int, *, ch: str, k: int) -> None:
    """Print an n by n grid: the cell in row i and column j (from 0) is '{ch}' if (i + j) % {k} == 0, else '.'."""
    for i in range(n):
        print(''.join(ch if (i + j) % k == 0 else '.' for j in range(n)))


_PATTERNS = {1: (_multiples, _character_line, _two_values),
             2: (_triangle, _not_divisible, _countdown),
             3: (_fizzbuzz, _grid)}


def _patterns(rng: random.Random, level: int) -> Problem:
    """One integer n; print a sequence, a shape or FizzBuzz-like lines."""
    k, a, b = rng.randint(2, 9), *rng.sample(range(2, 8), 2)
    ch = rng.choice("*#+@")
    w1, w2 = rng.sample(("fizz", "buzz", "ping", "pong", "zip", "zap", "foo", "bar"), 2)
    inputs = [f"{n}\n" for n in rng.sample(range(1, 16), TESTS_PER_PROBLEM)]
    return stdin_problem("The input is one integer n (n >= 1). ", "n = int(input())\n", rng.choice(_PATTERNS[level]),
                         inputs, k=k, a=a, b=b, ch=ch, w1=w1, w2=w2, both=w1 + w2)


STDIN: dict[str, Family] = {"pairs": _pairs, "numbers": _numbers, "text": _text, "records": _records,
                            "patterns": _patterns}
