"""LeetCode-style families: the tests call one function. Each reference's docstring is
its statement and its keyword-only parameters are the drawn values (see
:mod:`.reference`); the tables list a family's references by level, in draw order.
"""

from __future__ import annotations

import random

from hp_agent.envs.code.families.reference import (
    COMMON,
    LETTERS,
    TESTS_PER_PROBLEM,
    functional_problem,
    numbers,
    word,
)
from hp_agent.envs.generated import Family, Problem

# ---- strings: transform(s) -> str ------------------------------------------------------


def _reverse(s: str) -> str:
    """Return s reversed."""
    return s[::-1]


def _repeat(s: str, *, k: int) -> str:
    """Return s repeated {k} times."""
    return s * k


def _replace(s: str, *, a: str, b: str) -> str:
    """Return s with every '{a}' replaced by '{b}'."""
    return s.replace(a, b)


def _append(s: str, *, suffix: str) -> str:
    """Return s followed by '{suffix}'."""
    return s + suffix


def _upper(s: str) -> str:
    """Return s in upper case."""
    return s.upper()


def _remove(s: str, *, a: str) -> str:
    """Return s with every '{a}' removed."""
    return s.replace(a, '')


def _every_kth(s: str, *, k: int) -> str:
    """Return the characters of s at indices 0, {k}, {k2}, ... (every {k}th one)."""
    return s[::k]


def _no_vowels(s: str) -> str:
    """Return s without its vowels (a, e, i, o, u)."""
    return ''.join(c for c in s if c not in 'aeiou')


def _rotate(s: str, *, k: int) -> str:
    """Return s rotated left by {k} characters ('abcdef' rotated by 2 is 'cdefab'); rotate by {k} modulo the
    length, and an empty s stays empty."""
    return s[k % len(s):] + s[:k % len(s)] if s else s


def _double(s: str, *, a: str, aa: str) -> str:
    """Return s with every '{a}' doubled."""
    return s.replace(a, aa)


def _run_length(s: str) -> str:
    """Return the run-length encoding of s: each run of one character becomes the character and the run's length,
    e.g. 'aaabcc' -> 'a3b1c2'."""
    out = ''
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out += s[i] + str(j - i)
        i = j
    return out


def _caesar(s: str, *, k: int) -> str:
    """Shift every letter of s (all lowercase) {k} places forward in the alphabet, wrapping from 'z' to 'a'."""
    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) for c in s)


def _squeeze(s: str) -> str:
    """Return s with each run of a repeated character collapsed to one, e.g. 'aabccc' -> 'abc'."""
    return ''.join(c for i, c in enumerate(s) if i == 0 or s[i - 1] != c)


def _sorted_prefix(s: str, *, k: int) -> str:
    """Return s with its characters sorted, keeping only the first {k} of them."""
    return ''.join(sorted(s))[:k]


_STRINGS = {1: (_reverse, _repeat, _replace, _append, _upper),
            2: (_remove, _every_kth, _no_vowels, _rotate, _double),
            3: (_run_length, _caesar, _squeeze, _sorted_prefix)}


def _strings(rng: random.Random, level: int) -> Problem:
    """``transform(s) -> str``: reverse, replace, remove, rotate, run-length encode..."""
    args = [[word(rng, 1)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[""]]  # the edge case stays private
    a, b = rng.sample(sorted(set(COMMON)), 2)
    k = rng.randint(2, 5)
    suffix = word(rng, 2, 4, LETTERS)
    return functional_problem("transform", rng.choice(_STRINGS[level]), args, a=a, b=b, k=k, k2=2 * k,
                              suffix=suffix, aa=2 * a)


# ---- integers: compute(n) -> int -------------------------------------------------------


def _affine(n: int, *, a: int, b: int) -> int:
    """Return n * {a} + {b}."""
    return n * a + b


def _square_minus(n: int, *, b: int) -> int:
    """Return n squared minus {b}."""
    return n * n - b


def _remainder(n: int, *, a: int) -> int:
    """Return the remainder of n divided by {a} (Python's n % {a})."""
    return n % a


def _floor_divide(n: int, *, a: int) -> int:
    """Return n divided by {a}, rounded down."""
    return n // a


def _digit_sum_times(n: int, *, a: int) -> int:
    """Return the sum of the decimal digits of n (n >= 0) times {a}."""
    return sum(int(d) for d in str(n)) * a


def _count_multiples(n: int, *, a: int) -> int:
    """Return how many integers from 1 to n are divisible by {a}."""
    return sum(1 for i in range(1, n + 1) if i % a == 0)


def _sum_multiples(n: int, *, a: int, c: int) -> int:
    """Return the sum of the integers from 1 to n that are divisible by {a} or {c}."""
    return sum(i for i in range(1, n + 1) if i % a == 0 or i % c == 0)


def _count_digit(n: int, *, digit: str) -> int:
    """Return how many times the digit {a} occurs in n (n >= 0)."""
    return str(n).count(digit)


def _divisors_above(n: int, *, a: int) -> int:
    """Return the number of divisors of n (n >= 1) that are greater than {a}."""
    return sum(1 for d in range(1, n + 1) if n % d == 0 and d > a)


def _fibonacci_like(n: int, *, a: int, b: int) -> int:
    """Let f(0) = {a}, f(1) = {b} and f(i) = f(i - 1) + f(i - 2). Return f(n) (n >= 0)."""
    x, y = a, b
    for _ in range(n):
        x, y = y, x + y
    return x


def _next_common_multiple(n: int, *, a: int, c: int) -> int:
    """Return the smallest integer m >= n divisible by both {a} and {c}."""
    m = n
    while m % a or m % c:
        m += 1
    return m


def _divisions_to_zero(n: int, *, a: int) -> int:
    """Return how many times n (n >= 0) must be divided by {a}, rounding down, to reach 0."""
    steps = 0
    while n:
        n //= a
        steps += 1
    return steps


_INTEGERS = {1: (_affine, _square_minus, _remainder, _floor_divide),
             2: (_digit_sum_times, _count_multiples, _sum_multiples, _count_digit),
             3: (_divisors_above, _fibonacci_like, _next_common_multiple, _divisions_to_zero)}


def _integers(rng: random.Random, level: int) -> Problem:
    """``compute(n) -> int``: linear maps, digit sums, divisor counts, recurrences..."""
    a, b = rng.randint(2, 9), rng.randint(1, 30)
    c = rng.choice([x for x in range(2, 10) if x != a])
    args = [[n] for n in rng.sample(range(0 if level > 1 else -30, 200), TESTS_PER_PROBLEM)]
    positive = [[n] for n in rng.sample(range(1, 120), TESTS_PER_PROBLEM)]
    reference = rng.choice(_INTEGERS[level])
    inputs = positive if reference is _divisors_above else args  # every n has a divisor count only if n >= 1
    return functional_problem("compute", reference, inputs, a=a, b=b, c=c, digit=str(a))


# ---- lists: aggregate(nums) -> int -----------------------------------------------------


def _sum_above(nums: list[int], *, t: int) -> int:
    """Return the sum of the elements greater than {t}."""
    return sum(x for x in nums if x > t)


def _count_divisible(nums: list[int], *, k: int) -> int:
    """Return how many elements are divisible by {k}."""
    return sum(1 for x in nums if x % k == 0)


def _even_index_sum(nums: list[int], *, k: int) -> int:
    """Return the sum of the elements at even indices times {k}."""
    return sum(nums[::2]) * k


def _sum_plus(nums: list[int], *, t: int) -> int:
    """Return the sum of all elements plus {t}."""
    return sum(nums) + t


def _pairs_above(nums: list[int], *, t: int) -> int:
    """Return the number of adjacent pairs nums[i], nums[i + 1] whose sum is greater than {t}."""
    return sum(1 for x, y in zip(nums, nums[1:]) if x + y > t)


def _spread(nums: list[int], *, t: int) -> int:
    """Return the largest element minus the smallest, or {t} for an empty list."""
    return max(nums) - min(nums) if nums else t


def _product_modulo(nums: list[int], *, m: int) -> int:
    """Return the product of the elements modulo {m} (1 for an empty list, before the modulo)."""
    p = 1
    for x in nums:
        p = p * x % m
    return p % m


def _squares_below(nums: list[int], *, t: int) -> int:
    """Return the sum of the squares of the elements smaller than {t}."""
    return sum(x * x for x in nums if x < t)


def _longest_increasing_run(nums: list[int], *, k: int) -> int:
    """Return the length of the longest run of consecutive strictly increasing elements times {k} (0 for an empty
    list)."""
    best = run = 0
    for i, x in enumerate(nums):
        run = run + 1 if i and x > nums[i - 1] else 1
        best = max(best, run)
    return best * k


def _best_window(nums: list[int], *, k: int) -> int:
    """Return the largest sum of {k} consecutive elements (0 if there are fewer than {k})."""
    if len(nums) < k:
        return 0
    return max(sum(nums[i:i + k]) for i in range(len(nums) - k + 1))


def _distinct_above(nums: list[int], *, t: int) -> int:
    """Return how many distinct values x with x > {t} appear in nums."""
    return len({x for x in nums if x > t})


def _alternating_sum(nums: list[int], *, k: int) -> int:
    """Return the sum of the elements whose index is divisible by {k} minus the sum of the others."""
    return sum(x if i % k == 0 else -x for i, x in enumerate(nums))


_LISTS = {1: (_sum_above, _count_divisible, _even_index_sum, _sum_plus),
          2: (_pairs_above, _spread, _product_modulo, _squares_below),
          3: (_longest_increasing_run, _best_window, _distinct_above, _alternating_sum)}


def _lists(rng: random.Random, level: int) -> Problem:
    """``aggregate(nums) -> int``: filtered sums, counts, windows, runs."""
    args = [[numbers(rng)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[[]]]  # the edge case stays private
    t, k, m = rng.randint(-5, 30), rng.randint(2, 6), rng.choice((7, 11, 13, 97, 101))
    return functional_problem("aggregate", rng.choice(_LISTS[level]), args, t=t, k=k, m=m)


# ---- list_ops: transform_list(nums) -> list[int] ---------------------------------------


def _scaled(nums: list[int], *, k: int) -> list[int]:
    """Return the list with every element multiplied by {k}."""
    return [x * k for x in nums]


def _kept_above(nums: list[int], *, t: int) -> list[int]:
    """Return the elements greater than {t}, in their original order."""
    return [x for x in nums if x > t]


def _sorted_ascending(nums: list[int]) -> list[int]:
    """Return the elements sorted in {order} order."""
    return sorted(nums)


def _sorted_descending(nums: list[int]) -> list[int]:
    """Return the elements sorted in {order} order."""
    return sorted(nums, reverse=True)


def _shifted(nums: list[int], *, t: int) -> list[int]:
    """Return the list with {t} added to every element."""
    return [x + t for x in nums]


def _rotated(nums: list[int], *, k: int) -> list[int]:
    """Return the list rotated left by {k} positions (by {k} modulo the length; an empty list stays empty)."""
    if not nums:
        return []
    s = k % len(nums)
    return nums[s:] + nums[:s]


def _running_sums(nums: list[int], *, t: int) -> list[int]:
    """Return the running sums of the list, each plus {t}: element i is nums[0] + ... + nums[i] + {t}."""
    out, total = [], 0
    for x in nums:
        total += x
        out.append(total + t)
    return out


def _residue_class(nums: list[int], *, k: int, r: int) -> list[int]:
    """Return, sorted ascending, the elements whose remainder modulo {k} is {r}."""
    return sorted(x for x in nums if x % k == r)


def _every_kth_reversed(nums: list[int], *, k: int) -> list[int]:
    """Return the elements at indices 0, {k}, {k2}, ... in reverse order."""
    return nums[::k][::-1]


def _window_sums(nums: list[int], *, k: int) -> list[int]:
    """Return the sums of every window of {k} consecutive elements, from left to right."""
    return [sum(nums[i:i + k]) for i in range(len(nums) - k + 1)]


def _multiples_first(nums: list[int], *, k: int) -> list[int]:
    """Return the list with the multiples of {k} moved to the front, keeping the relative order within both
    groups."""
    return [x for x in nums if x % k == 0] + [x for x in nums if x % k]


def _distinct_by_residue(nums: list[int], *, k: int) -> list[int]:
    """Remove repeated values (keep first occurrences), then sort by x % {k} and, on ties, by x."""
    seen = []
    for x in nums:
        if x not in seen:
            seen.append(x)
    return sorted(seen, key=lambda x: (x % k, x))


def _scaled_differences(nums: list[int], *, k: int) -> list[int]:
    """Return the differences nums[i + 1] - nums[i], each multiplied by {k}."""
    return [(y - x) * k for x, y in zip(nums, nums[1:])]


_LIST_OPS = {1: (_scaled, _kept_above, _sorted_ascending, _shifted),
             2: (_rotated, _running_sums, _residue_class, _every_kth_reversed),
             3: (_window_sums, _multiples_first, _distinct_by_residue, _scaled_differences)}


def _list_ops(rng: random.Random, level: int) -> Problem:
    """``transform_list(nums) -> list[int]``: maps, filters, rotations, windows."""
    args = [[numbers(rng)] for _ in range(TESTS_PER_PROBLEM - 1)] + [[[]]]  # the edge case stays private
    t, k = rng.randint(-5, 30), rng.randint(2, 6)
    r = rng.randrange(k)
    order = rng.choice(("ascending", "descending"))
    reference = rng.choice(_LIST_OPS[level])
    if reference is _sorted_ascending and order == "descending":
        reference = _sorted_descending  # one table slot, the statement's order picks the program
    return functional_problem("transform_list", reference, args, t=t, k=k, k2=2 * k, r=r, order=order)


# ---- predicates: check(s) / check(n) -> bool -------------------------------------------


def _contains(s: str, *, c: str) -> bool:
    """Return True if s contains the letter '{c}', else False."""
    return c in s


def _starts_with(s: str, *, prefix: str) -> bool:
    """Return True if s starts with '{prefix}', else False."""
    return s.startswith(prefix)


def _longer_than(s: str, *, k: int) -> bool:
    """Return True if s is longer than {k} characters, else False."""
    return len(s) > k


def _palindrome_without(s: str, *, c: str) -> bool:
    """Return True if s reads the same backwards once every '{c}' is removed."""
    t = s.replace(c, '')
    return t == t[::-1]


def _divisible_not(n: int, *, a: int, b: int) -> bool:
    """Return True if n is divisible by {a} but not by {b}."""
    return n % a == 0 and n % b != 0


def _no_frequent_character(s: str, *, k: int) -> bool:
    """Return True if no character occurs in s more than {times} times."""
    return all(s.count(ch) < k for ch in s)


def _balanced(s: str, *, opens: str, closes: str) -> bool:
    """s holds only the characters {characters}. Return True if its brackets are balanced: {first} and {second}
    pairs, properly nested."""
    stack = []
    for ch in s:
        if ch in opens:
            stack.append(ch)
        elif not stack or opens.index(stack.pop()) != closes.index(ch):
            return False
    return not stack


def _digit_sum_divisible(n: int, *, a: int) -> bool:
    """Return True if the digits of n add up to a multiple of {a}."""
    return sum(int(d) for d in str(n)) % a == 0


def _counted_non_palindrome(s: str, *, c: str, times: int) -> bool:
    """Return True if s contains '{c}' exactly {times} times and is not a palindrome."""
    return s.count(c) == times and s != s[::-1]


# (reference, the name of its input list)
_PREDICATES = {1: ((_contains, "words"), (_starts_with, "words"), (_longer_than, "words")),
               2: ((_palindrome_without, "palindromes"), (_divisible_not, "numbers"),
                   (_no_frequent_character, "words")),
               3: ((_balanced, "brackets"), (_digit_sum_divisible, "numbers"),
                   (_counted_non_palindrome, "palindromes"))}


def _predicates(rng: random.Random, level: int) -> Problem:
    """``check(...) -> bool``: membership, palindromes, divisibility, brackets."""
    c = rng.choice(COMMON)
    k = rng.randint(2, 5)
    a, b = rng.sample(range(2, 10), 2)
    prefix = word(rng, 1, 2)
    words = [[word(rng, 0, 8)] for _ in range(TESTS_PER_PROBLEM)]
    words[1] = [prefix + word(rng, 0, 4) + c]  # at least one input says True for each level-1 check
    palindromes = [[w[0] + w[0][::-1][1:]] if i % 2 else w for i, w in enumerate(words)]
    integers = [[n] for n in rng.sample(range(1, 400), TESTS_PER_PROBLEM - 1)] + [[a * 7]]
    pair = rng.choice(("()[]", "(){}", "()<>", "[]{}"))
    brackets = [["".join(rng.choice(pair) for _ in range(rng.randint(0, 8)))] for _ in range(TESTS_PER_PROBLEM)]
    brackets[1], brackets[2] = [pair[0] + pair[2] + pair[3] + pair[1]], [pair[0] + pair[1] + pair[2] + pair[3]]
    reference, inputs = rng.choice(_PREDICATES[level])
    named = {"words": words, "palindromes": palindromes, "numbers": integers, "brackets": brackets}
    return functional_problem("check", reference, named[inputs], c=c, k=k, times=k - 1, a=a, b=b, prefix=prefix,
                              characters=" ".join(pair), first=pair[:2], second=pair[2:], opens=pair[0] + pair[2],
                              closes=pair[1] + pair[3])


FUNCTIONAL: dict[str, Family] = {"strings": _strings, "integers": _integers, "lists": _lists,
                                 "list_ops": _list_ops, "predicates": _predicates}
