"""Math problem generators: eight skills, each a seeded word-problem family with exact answers.

Answers are exact strings math-verify parses: integers (``42``, ``-7``) or fractions in
lowest terms (``\\frac{3}{4}``, ``-\\frac{5}{2}``). Level 1 has small numbers and one or
two steps, level 3 bigger numbers and more steps.
"""

from __future__ import annotations

import random
from fractions import Fraction
from math import gcd

from hp_agent.envs.generated import Family, Problem

_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Kira",
          "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor",
          "Wen", "Yusuf", "Zoe")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "books", "cookies", "stamps", "shells", "coins",
          "cards", "beads", "oranges", "balloons", "crayons", "buttons", "tickets", "eggs", "seeds")
_BOXES = ("boxes", "bags", "jars", "baskets", "crates", "packs", "trays")
_WHOLES = ("pizza", "cake", "pie", "chocolate bar", "loaf of bread", "watermelon")
_PLACES = ("garden", "room", "poster", "field", "table top", "playground", "rug", "parking lot")
_GOODS = ("jacket", "bicycle", "lamp", "backpack", "pair of shoes", "video game", "chair", "tent")


def _fmt(value: Fraction | int) -> str:
    """Exact answer text: ``-7`` for integers, ``\\frac{a}{b}`` / ``-\\frac{a}{b}`` otherwise."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _linear(a: int, b: int) -> str:
    """``a x + b`` as an equation side: ``3x - 4``, ``-x + 7``, ``x``."""
    coef = {1: "", -1: "-"}.get(a, str(a))
    if b == 0:
        return f"{coef}x"
    return f"{coef}x {'+' if b > 0 else '-'} {abs(b)}"


def _p(n: int) -> str:
    """An integer inside a worked step, negatives in parentheses: ``(-6)``."""
    return f"({n})" if n < 0 else str(n)


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _problem(question: str, value: Fraction, steps: list[str]) -> Problem:
    """The problem of ``question``: its exact answer and a worked solution that ends in it."""
    answer = _fmt(value)
    solution = f"Let's solve it step by step. {' '.join(steps)} The final answer is \\boxed{{{answer}}}."
    return Problem(question, solution, answer)


def _arithmetic(rng: random.Random, level: int) -> Problem:
    """Multi-step add/subtract story: level + 1 events on a starting count."""
    name, friend = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    top = (20, 100, 1000)[level - 1]
    total = rng.randint(top // 4, top)
    sentences, steps = [f"{name} has {total} {item}."], [f"{name} starts with {total}."]
    for connective in ("Then", "After that,", "Later,", "Finally,")[: level + 1]:
        if total > 1 and rng.random() < 0.5:
            k = rng.randint(1, total - 1)
            event = rng.choice((f"gives {k} to {friend}", f"loses {k}", f"uses {k}", f"sells {k}"))
            steps.append(f"{total} - {k} = {total - k}.")
            total -= k
        else:
            k = rng.randint(1, top)
            event = rng.choice((f"buys {k} more", f"finds {k} more", f"gets {k} from {friend}"))
            steps.append(f"{total} + {k} = {total + k}.")
            total += k
        sentences.append(f"{connective} {name} {event}.")
    ask = rng.choice((f"How many {item} does {name} have now?", f"How many {item} does {name} end up with?"))
    return _problem(" ".join(sentences + [ask]), Fraction(total), steps)


def _multiplication(rng: random.Random, level: int) -> Problem:
    """Equal groups: a x b (level 1-2) or a x b x c (level 3)."""
    name = rng.choice(_NAMES)
    item, box = rng.choice(_ITEMS), rng.choice(_BOXES)
    a = rng.randint(2, 9) if level == 1 else rng.randint(11, 99)
    b = rng.randint(2, 9) if level == 1 else rng.randint(3, 12)
    if level == 3:
        a, c = rng.randint(2, 12), rng.randint(5, 25)
        question = (f"A shop has {a} shelves. Each shelf holds {b} {box}, and each of the {box} "
                    f"contains {c} {item}. How many {item} are in the shop?")
        steps = [f"{a} x {b} = {a * b} {box}.", f"{a * b} x {c} = {a * b * c}."]
        return _problem(question, Fraction(a * b * c), steps)
    question = rng.choice((
        f"{name} has {a} {box} with {b} {item} in each. How many {item} does {name} have in total?",
        f"A hall has {a} rows of chairs with {b} chairs in each row. How many chairs are there?",
        f"{name} reads {b} pages every day for {a} days. How many pages does {name} read?",
    ))
    return _problem(question, Fraction(a * b), [f"{a} x {b} = {a * b}."])


def _division(rng: random.Random, level: int) -> Problem:
    """Equal sharing (level 1), quotient or remainder (level 2), groups needed = ceil (level 3)."""
    name = rng.choice(_NAMES)
    item, box = rng.choice(_ITEMS), rng.choice(_BOXES)
    if level == 1:
        k, each = rng.randint(2, 9), rng.randint(2, 12)
        question = (f"{name} shares {k * each} {item} equally among {k} friends. "
                    f"How many {item} does each friend get?")
        return _problem(question, Fraction(each), [f"{k * each} / {k} = {each}."])
    k = rng.randint(3, 12) if level == 2 else rng.randint(12, 60)
    n = rng.randint(20, 200) if level == 2 else rng.randint(100, 1000)
    if n % k == 0:
        n += rng.randint(1, k - 1)  # keep a remainder so the three questions differ
    full, left = divmod(n, k)
    steps = [f"{n} = {k} x {full} + {left}."]
    if level == 3:
        question = (f"{n} {item} must be packed into {box} that hold {k} each. "
                    f"How many {box} are needed to pack all of them?")
        steps.append(f"{full} full {box} plus one more for the {left} left over.")
        return _problem(question, Fraction(full + 1), steps)
    if rng.random() < 0.5:
        question = (f"{name} packs {n} {item} into {box} of {k}. How many {item} are left over "
                    f"after filling as many {box} as possible?")
        return _problem(question, Fraction(left), steps)
    question = f"{name} packs {n} {item} into {box} of {k}. How many {box} can be filled completely?"
    return _problem(question, Fraction(full), steps)


def _proper(rng: random.Random, max_denominator: int) -> Fraction:
    """A random fraction strictly between 0 and 1 with denominator <= max_denominator."""
    denominator = rng.randint(2, max_denominator)
    return Fraction(rng.randint(1, denominator - 1), denominator)


def _fractions(rng: random.Random, level: int) -> Problem:
    """Same-denominator sums (1), unlike denominators (2), products / part of a remainder (3)."""
    name, friend = rng.sample(_NAMES, 2)
    whole = rng.choice(_WHOLES)
    if level == 1:
        d = rng.randint(3, 12)
        a = rng.randint(1, d - 2)
        b = rng.randint(1, d - 1 - a)
        x, y = Fraction(a, d), Fraction(b, d)
        question = (f"{name} ate {a}/{d} of a {whole} and {friend} ate {b}/{d} of it. "
                    f"What fraction of the {whole} did they eat together?")
        return _problem(question, x + y, [f"{a}/{d} + {b}/{d} = {_fmt(x + y)}."])
    if level == 2:
        x, y, op = _proper(rng, 9), _proper(rng, 9), rng.choice(("+", "-"))
        result = x + y if op == "+" else x - y
        question = rng.choice((f"What is {x} {op} {y}?",
                               f"Compute {x} {op} {y} as a fraction in lowest terms."))
        return _problem(question, result, [f"Use a common denominator: {x} {op} {y} = {_fmt(result)}."])
    if rng.random() < 0.5:
        x, y = _proper(rng, 10), _proper(rng, 10)
        question = f"What is {x} of {y}? Give the answer as a fraction."
        return _problem(question, x * y, [f"{x} x {y} = {_fmt(x * y)}."])
    x, y = Fraction(1, rng.randint(2, 5)), Fraction(1, rng.randint(2, 5))
    n = (x.denominator * y.denominator) * rng.randint(1, 12)
    item = rng.choice(_ITEMS)
    rest = n - n * x
    left = rest - rest * y
    question = (f"{name} had {n} {item} and gave {x} of them to {friend}. "
                f"Then {name} used {y} of the remaining {item}. How many {item} are left?")
    return _problem(question, left, [f"{n} - {n * x} = {rest}.", f"{rest} - {rest * y} = {left}."])


def _linear_equation(rng: random.Random, level: int) -> Problem:
    """Solve for x: x + b = c or a x = c (1), a x + b = c (2), a x + b = c x + d (3)."""
    if level == 3:
        a, c = rng.sample([k for k in range(-9, 10) if k != 0], 2)
        b, d = rng.randint(-30, 30), rng.randint(-30, 30)
        x = Fraction(d - b, a - c)
        question = f"Solve for x: {_linear(a, b)} = {_linear(c, d)}."
        return _problem(question, x, [f"Collect terms: ({a} - {_p(c)})x = {d} - {_p(b)}, so {a - c}x = {d - b}."])
    x = rng.randint(1, 20) if level == 1 else rng.randint(-10, 20)
    if level == 1:
        a, b = (1, rng.randint(1, 30)) if rng.random() < 0.5 else (rng.randint(2, 9), 0)
    else:
        a, b = rng.randint(2, 9), rng.choice([k for k in range(-20, 21) if k != 0])
    c = a * x + b
    if level == 2 and x > 0 and rng.random() < 0.5:
        verb = f"add {b}" if b > 0 else f"subtract {-b}"
        question = f"I think of a number, multiply it by {a} and {verb}. The result is {c}. What is my number?"
    else:
        question = f"Solve for x: {_linear(a, b)} = {c}."
    steps = [f"{_linear(a, 0)} = {c} - {_p(b)} = {c - b}."] + ([f"x = {c - b} / {a} = {x}."] if a != 1 else [])
    return _problem(question, Fraction(x), steps)


def _percent(rng: random.Random, level: int) -> Problem:
    """p% of n (1), discount or increase (2), what percent / two successive changes (3)."""
    p = rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 80, 90))
    step = 100 // gcd(p, 100)  # n a multiple of this makes p% of n whole
    if level == 1:
        n = step * rng.randint(1, 200 // step + 2)
        question = rng.choice((f"What is {p}% of {n}?",
                               f"A school has {n} students and {p}% of them walk to school. How many students walk?"))
        return _problem(question, Fraction(p * n, 100), [f"{p}/100 x {n} = {_fmt(Fraction(p * n, 100))}."])
    if level == 2:
        price = 20 * rng.randint(1, 25)
        sign = rng.choice(("-", "+"))
        result = Fraction(price * (100 - p if sign == "-" else 100 + p), 100)
        change = f"It is on sale for {p}% off" if sign == "-" else f"Its price goes up by {p}%"
        question = f"A {rng.choice(_GOODS)} costs ${price}. {change}. What is the new price in dollars?"
        return _problem(question, result, [f"{price} x (100 {sign} {p})/100 = {_fmt(result)}."])
    if rng.random() < 0.5:
        whole = step * rng.randint(2, 40)
        part = whole * p // 100
        question = f"{part} is what percent of {whole}? Answer with the number of percent."
        return _problem(question, Fraction(p), [f"{part}/{whole} x 100 = {p}."])
    up, down = rng.choice((10, 20, 30, 40, 50)), rng.choice((10, 20, 25, 50))
    price = 200 * rng.randint(1, 15)  # (100 + up)(100 - down) is a multiple of 50: whole dollars
    result = Fraction(price * (100 + up) * (100 - down), 10_000)
    question = (f"A store raises the price of a ${price} {rng.choice(_GOODS)} by {up}%, then cuts the new "
                f"price by {down}%. What is the final price in dollars?")
    middle = Fraction(price * (100 + up), 100)
    steps = [f"{price} x {100 + up}/100 = {_fmt(middle)}.", f"{_fmt(middle)} x {100 - down}/100 = {_fmt(result)}."]
    return _problem(question, result, steps)


def _geometry(rng: random.Random, level: int) -> Problem:
    """Rectangle area/perimeter (1), triangle area / square perimeter (2), multi-step (3)."""
    place = rng.choice(_PLACES)
    if level == 1:
        w, h = rng.randint(2, 20), rng.randint(2, 20)
        start = f"A rectangular {place} is {w} m long and {h} m wide."
        if rng.random() < 0.5:
            steps = [f"Area = {w} x {h} = {w * h}."]
            return _problem(f"{start} What is its area in square meters?", Fraction(w * h), steps)
        steps = [f"Perimeter = 2 x ({w} + {h}) = {2 * (w + h)}."]
        return _problem(f"{start} What is its perimeter in meters?", Fraction(2 * (w + h)), steps)
    if level == 2:
        if rng.random() < 0.5:
            b, h = rng.randint(2, 30), rng.randint(2, 30)
            area = Fraction(b * h, 2)
            question = f"A triangle has a base of {b} cm and a height of {h} cm. What is its area in square cm?"
            return _problem(question, area, [f"Area = {b} x {h} / 2 = {_fmt(area)}."])
        s = rng.randint(2, 30)
        question = f"A square {place} has an area of {s * s} square meters. What is its perimeter in meters?"
        return _problem(question, Fraction(4 * s), [f"Side = sqrt({s * s}) = {s}.", f"Perimeter = 4 x {s} = {4 * s}."])
    kind = rng.randrange(3)
    if kind == 0:
        w, h = rng.randint(3, 40), rng.randint(3, 40)
        question = (f"A rectangular {place} has a perimeter of {2 * (w + h)} meters and a width of {h} meters. "
                    f"What is its area in square meters?")
        steps = [f"Length = {2 * (w + h)}/2 - {h} = {w}.", f"Area = {w} x {h} = {w * h}."]
        return _problem(question, Fraction(w * h), steps)
    if kind == 1:
        a, b, c = rng.choice(((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25)))
        k = rng.randint(1, 6)
        question = f"A right triangle has legs of length {k * a} and {k * b}. How long is its hypotenuse?"
        return _problem(question, Fraction(k * c), [f"sqrt({k * a}^2 + {k * b}^2) = sqrt({(k * c) ** 2}) = {k * c}."])
    w, h = rng.randint(8, 30), rng.randint(8, 30)
    cw, ch = rng.randint(2, w - 2), rng.randint(2, h - 2)
    area = w * h - cw * ch
    question = (f"A rectangular {place} measures {w} m by {h} m. A {cw} m by {ch} m corner is cut out of it. "
                f"What is the area of the remaining shape in square meters?")
    return _problem(question, Fraction(area), [f"{w} x {h} - {cw} x {ch} = {w * h} - {cw * ch} = {area}."])


def _sequence(rng: random.Random, level: int) -> Problem:
    """Next term (1), n-th term of an arithmetic sequence (2), sum of n terms / geometric (3)."""
    a = rng.randint(1, 20) if level == 1 else rng.randint(-20, 30)
    d = rng.randint(2, 9) if level == 1 else rng.choice([k for k in range(-9, 13) if k != 0])
    shown = ", ".join(str(a + i * d) for i in range(4))
    if level == 1:
        question = f"What is the next number in the sequence {shown}, ...?"
        return _problem(question, Fraction(a + 4 * d), [f"The difference is {d}, so {a + 3 * d} + {d} = {a + 4 * d}."])
    n = rng.randint(10, 60)
    nth = a + (n - 1) * d
    if level == 2:
        question = rng.choice((f"What is the {_ordinal(n)} term of the arithmetic sequence {shown}, ...?",
                               f"An arithmetic sequence starts at {a} and each term adds {d}. "
                               f"What is its {_ordinal(n)} term?"))
        return _problem(question, Fraction(nth), [f"a_{n} = {a} + ({n} - 1) x {_p(d)} = {nth}."])
    if rng.random() < 0.5:
        total = n * (a + nth) // 2  # n(a + a_n) is even: a + a_n = 2a + (n-1)d
        question = f"What is the sum of the first {n} terms of the arithmetic sequence {shown}, ...?"
        return _problem(question, Fraction(total), [f"a_{n} = {nth}.", f"Sum = {n} x ({a} + {_p(nth)}) / 2 = {total}."])
    start, ratio = rng.randint(1, 9), rng.randint(2, 4)
    terms = [start * ratio**i for i in range(5)]
    question = f"What is the next number in the sequence {', '.join(map(str, terms[:4]))}, ...?"
    steps = [f"Each term is {ratio} times the last: {terms[3]} x {ratio} = {terms[4]}."]
    return _problem(question, Fraction(terms[4]), steps)


# Skill type (the task_type of generated tasks) -> generator; the name is the function's.
GENERATORS: dict[str, Family] = {
    generate.__name__.lstrip("_"): generate
    for generate in (
        _arithmetic, _multiplication, _division, _fractions, _linear_equation, _percent, _geometry, _sequence
    )
}
