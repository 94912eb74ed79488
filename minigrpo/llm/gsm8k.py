"""Math word problems in GSM8K's format: a generator, a loader, the prompt and answer formats, rewards.

GSM8K (Cobbe et al. 2021, ``openai/gsm8k`` config ``main``) has two columns: ``question`` and
``answer``, the answer being worked reasoning lines with calculator annotations, then ``#### n``::

    question: Tom buys 4 pens for $3 each. He pays with a $20 bill. How much change does he get?
    answer:   The pens cost 4*3 = <<4*3=12>>12 dollars.
              Tom gets 20-12 = <<20-12=8>>8 dollars in change.
              #### 8

:func:`load_gsm8k` loads the real data set where the hub can be reached (and is allowed:
``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` are respected), and otherwise returns problems from
:func:`generate_word_problems` in exactly that shape: eleven templates (shopping, rates, ages,
sharing, savings, packing, trips, buses, fractions, legs), 2–4 arithmetic steps, integer answers,
every product and quotient with a one-digit factor or a round divisor, deterministic by seed —
thousands of distinct problems that a 5–20M-parameter model can learn.

The completion format (the prompt asks for it; :func:`format_reward` checks it)::

    <think>
    The pens cost 4*3 = 12 dollars.
    Tom gets 20-12 = 8 dollars in change.
    </think>
    <answer>8</answer>

:func:`sft_target` turns a GSM8K answer into that text (calculator annotations dropped), which is
what SFT imitates. :func:`correctness_reward` and :func:`format_reward` are TRL reward functions:
they run unchanged in ``trl.GRPOTrainer(reward_funcs=[correctness_reward, format_reward])`` on the
rows :func:`prepare_gsm8k` makes (columns ``prompt``, ``answer`` — the number — and ``solution``).
"""

from __future__ import annotations

import functools
import os
import random
import re
import socket
import string
import threading
from collections.abc import Callable

from minigrpo.llm.rewards import completion_text

#: GSM8K's split sizes; the generated stand-in has the same
SPLIT_SIZES = {"train": 7473, "test": 1319}
SYSTEM_PROMPT = ("Solve the math word problem. Think step by step between <think> and </think>, then give "
                 "only the final number between <answer> and </answer>.")
#: every character the generated problems, the tags and the system prompt use (for a character tokenizer)
ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FORMAT = re.compile(r"\s*<think>\n?(?P<think>.+?)\n?</think>\s*<answer>\s*(?P<answer>[^<>]+?)\s*</answer>\s*",
                     re.DOTALL)
_CALCULATOR = re.compile(r"<<[^<>]*>>")

# ----------------------------------------------------------------------------- the generator

_PEOPLE = [("Tom", "he", "his", "him"), ("Mia", "she", "her", "her"), ("Sam", "he", "his", "him"),
           ("Lena", "she", "her", "her"), ("Omar", "he", "his", "him"), ("Nora", "she", "her", "her"),
           ("Ben", "he", "his", "him"), ("Ava", "she", "her", "her"), ("Leo", "he", "his", "him"),
           ("Zoe", "she", "her", "her"), ("Raj", "he", "his", "him"), ("Emma", "she", "her", "her"),
           ("Jack", "he", "his", "him"), ("Lily", "she", "her", "her"), ("Max", "he", "his", "him"),
           ("Sara", "she", "her", "her")]
_ITEMS = ["pens", "notebooks", "apples", "stickers", "books", "cupcakes", "toy cars", "candles", "markers",
          "muffins", "oranges", "balloons", "pencils", "cookies", "comics", "plants"]
_SWEETS = ["candies", "cookies", "grapes", "marbles", "cards", "beads", "shells", "stamps"]
_MAKERS = [("A machine", "toys"), ("A bakery", "loaves"), ("A printer", "posters"), ("A farm", "eggs"),
           ("A factory", "chairs"), ("A robot", "boxes")]
_FRUIT = ["apples", "pears", "oranges", "lemons", "peaches", "plums"]
_THINGS = ["book", "game", "hat", "ball", "kite", "lamp", "bag", "watch"]
_FRACTIONS = [(2, "half"), (3, "a third"), (4, "a quarter")]


class _Person:
    def __init__(self, rng: random.Random):
        self.name, self.he, self.his, self.him = rng.choice(_PEOPLE)
        self.He, self.His = self.he.capitalize(), self.his.capitalize()


def _step(before: str, a: int, op: str, b: int, after: str) -> tuple[str, int]:
    """One GSM8K reasoning line, ``before a*b = <<a*b=c>>c after.``, and its result."""
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    assert op != "/" or a % b == 0, "a generated division must be exact"
    return f"{before} {a}{op}{b} = <<{a}{op}{b}={c}>>{c}{after}.", c


def _change(rng: random.Random) -> tuple[str, list[str]]:
    p, item = _Person(rng), rng.choice(_ITEMS)
    n, price = rng.randint(2, 9), rng.randint(2, 11)
    cost = n * price
    bill = next(b for b in (20, 50, 100) if b > cost)
    s1, c = _step(f"The {item} cost", n, "*", price, " dollars")
    s2, _ = _step(f"{p.name} gets", bill, "-", c, " dollars in change")
    q = f"{p.name} buys {n} {item} for ${price} each. {p.He} pays with a ${bill} bill. How much change does {p.he} get?"
    return q, [s1, s2]


def _two_items(rng: random.Random) -> tuple[str, list[str]]:
    p = _Person(rng)
    first, second = rng.sample(_ITEMS, 2)
    n, a, m, b = rng.randint(2, 9), rng.randint(2, 15), rng.randint(2, 9), rng.randint(2, 15)
    s1, x = _step(f"The {first} cost", n, "*", a, " dollars")
    s2, y = _step(f"The {second} cost", m, "*", b, " dollars")
    s3, _ = _step(f"{p.He} spends", x, "+", y, " dollars in all")
    q = f"{p.name} buys {n} {first} at ${a} each and {m} {second} at ${b} each. How much does {p.he} spend in all?"
    return q, [s1, s2, s3]


def _rate(rng: random.Random) -> tuple[str, list[str]]:
    maker, things = rng.choice(_MAKERS)
    r, h, d = rng.randint(3, 15), rng.randint(2, 8), rng.randint(2, 5)
    s1, per_day = _step("Each day it makes", r, "*", h, f" {things}")
    s2, total = _step(f"In {d} days it makes", per_day, "*", d, f" {things}")
    q = f"{maker} makes {r} {things} each hour. It works {h} hours a day. How many {things} does it make in {d} days?"
    if rng.random() < 0.5:
        return q, [s1, s2]
    sold = rng.randint(2, min(total - 1, 60))
    s3, _ = _step(f"After selling {sold}, there are", total, "-", sold, f" {things} left")
    q = q.replace("How many", f"It sells {sold} of them. How many").replace(f"does it make in {d} days",
                                                                            f"are left after {d} days")
    return q, [s1, s2, s3]


def _ages(rng: random.Random) -> tuple[str, list[str]]:
    p = _Person(rng)
    a = rng.randint(5, 30)
    b = rng.choice([x for x in range(2, 21) if (a + x) % 2 == 0])
    k = rng.randint(2, 10)
    s1, brother = _step("The brother is", a, "+", b, " years old")
    s2, sister = _step("The sister is", brother, "/", 2, " years old")
    s3, _ = _step(f"In {k} years she will be", sister, "+", k, " years old")
    q = (f"{p.name} is {a} years old. {p.His} brother is {b} years older than {p.him}. {p.His} sister is half "
         f"as old as the brother. How old will the sister be in {k} years?")
    return q, [s1, s2, s3]


def _sharing(rng: random.Random) -> tuple[str, list[str]]:
    p, sweets = _Person(rng), rng.choice(_SWEETS)
    friends, each, eaten = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 20)
    n = friends * each + eaten
    s1, rest = _step(f"After eating, {p.he} has", n, "-", eaten, f" {sweets}")
    s2, _ = _step("Each friend gets", rest, "/", friends, f" {sweets}")
    q = (f"{p.name} has {n} {sweets}. {p.He} eats {eaten} of them and shares the rest equally among {friends} "
         f"friends. How many {sweets} does each friend get?")
    return q, [s1, s2]


def _savings(rng: random.Random) -> tuple[str, list[str]]:
    p = _Person(rng)
    first, second = rng.sample(_THINGS, 2)
    s, w = rng.randint(5, 25), rng.randint(2, 9)
    total = s * w
    c = rng.randint(2, max(2, total // 2))
    d = rng.randint(1, max(1, min(99, total - c - 1)))
    s1, saved = _step(f"{p.He} saves", s, "*", w, " dollars")
    s2, spent = _step(f"{p.He} spends", c, "+", d, " dollars")
    s3, _ = _step(f"{p.He} has", saved, "-", spent, " dollars left")
    q = (f"{p.name} saves ${s} every week for {w} weeks. Then {p.he} spends ${c} on a {first} and ${d} on a "
         f"{second}. How much money does {p.he} have left?")
    return q, [s1, s2, s3]


def _packing(rng: random.Random) -> tuple[str, list[str]]:
    fruit = rng.choice(_FRUIT)
    boxes, per_box, bag = rng.randint(2, 9), rng.randint(6, 15), rng.randint(2, 6)
    total = boxes * per_box
    bags = rng.randint(max(1, (total - 20) // bag), (total - 1) // bag)
    bad = total - bags * bag
    s1, t = _step("The shop has", boxes, "*", per_box, f" {fruit}")
    s2, good = _step("After throwing away the bad ones,", t, "-", bad, " are left")
    s3, _ = _step("They fill", good, "/", bag, " bags")
    q = (f"A shop has {boxes} boxes with {per_box} {fruit} in each box. {bad} {fruit} are bad and thrown away. "
         f"The rest are packed in bags of {bag}. How many bags are filled?")
    return q, [s1, s2, s3]


def _trip(rng: random.Random) -> tuple[str, list[str]]:
    p = _Person(rng)
    v, h, w, d = rng.randint(5, 20), rng.randint(2, 4), rng.randint(1, 9), rng.randint(2, 5)
    s1, ride = _step(f"Each day {p.he} rides", v, "*", h, " km")
    s2, trip = _step("Each trip is", ride, "+", w, " km")
    s3, _ = _step(f"In {d} days {p.he} travels", trip, "*", d, " km")
    q = (f"{p.name} rides a bike at {v} km per hour for {h} hours, then walks {w} km. {p.He} makes this trip on "
         f"{d} days. How many km does {p.he} travel in all?")
    return q, [s1, s2, s3]


def _buses(rng: random.Random) -> tuple[str, list[str]]:
    while True:  # at most 9 buses and at most 20 students absent
        classes, students, size = rng.randint(2, 6), rng.randint(15, 30), rng.choice([10, 12, 15, 20, 25])
        total = classes * students
        low, high = max(1, (total - 20) // size), min(9, (total - 1) // size)
        if low <= high:
            break
    buses, price = rng.randint(low, high), 10 * rng.randint(2, 9)
    away = total - buses * size
    s1, t = _step("The school has", classes, "*", students, " students")
    s2, going = _step("Then", t, "-", away, " students go on the trip")
    s3, n = _step("They need", going, "/", size, " buses")
    s4, _ = _step("The buses cost", n, "*", price, " dollars")
    q = (f"A school has {classes} classes of {students} students. {away} students are absent on trip day. The "
         f"others ride in buses that carry {size} students each, and each bus costs ${price}. How much do the "
         f"buses cost?")
    return q, [s1, s2, s3, s4]


def _fraction(rng: random.Random) -> tuple[str, list[str]]:
    p, friend, cards = _Person(rng), rng.choice(_PEOPLE)[0], rng.choice(_SWEETS)
    f, word = rng.choice(_FRACTIONS)
    part, more = rng.randint(3, 20), rng.randint(2, 15)
    n = f * part
    s1, gave = _step(f"{p.He} gives away", n, "/", f, f" {cards}")
    s2, left = _step(f"{p.He} has", n, "-", gave, " left")
    s3, _ = _step(f"Now {p.he} has", left, "+", more, f" {cards}")
    q = (f"{p.name} had {n} {cards}. {p.He} gave {word} of them to {friend} and then bought {more} more. How many "
         f"{cards} does {p.he} have now?")
    return q, [s1, s2, s3]


def _legs(rng: random.Random) -> tuple[str, list[str]]:
    chickens, cows = rng.randint(2, 30), rng.randint(2, 20)
    s1, a = _step("The chickens have", chickens, "*", 2, " legs")
    s2, b = _step("The cows have", cows, "*", 4, " legs")
    s3, _ = _step("Together they have", a, "+", b, " legs")
    q = f"A farm has {chickens} chickens and {cows} cows. How many legs do the animals have in all?"
    return q, [s1, s2, s3]


#: the templates, by name: each draws ``(question, reasoning lines)``; the last line's result is the answer
TEMPLATES: dict[str, Callable[[random.Random], tuple[str, list[str]]]] = {
    "change": _change, "two_items": _two_items, "rate": _rate, "ages": _ages, "sharing": _sharing,
    "savings": _savings, "packing": _packing, "trip": _trip, "buses": _buses, "fraction": _fraction, "legs": _legs}


def word_problem(rng: random.Random, template: str | None = None) -> dict[str, str]:
    """One problem ``{"question", "answer"}`` in GSM8K's format (a random template unless one is named)."""
    if template is not None and template not in TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    question, lines = TEMPLATES[template or rng.choice(list(TEMPLATES))](rng)
    result = lines[-1].rsplit(">>", 1)[1].split(" ", 1)[0].rstrip(".")
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {result}"}


def generate_word_problems(num_problems: int, seed: int = 0, exclude=()) -> list[dict[str, str]]:
    """``num_problems`` distinct problems (no question twice, none in ``exclude``), the same for the same seed."""
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be an int >= 0, got {num_problems!r}")
    rng, seen, rows = random.Random(seed), set(exclude), []
    tries = 0
    while len(rows) < num_problems:
        row = word_problem(rng)
        tries += 1
        if tries > 50 * num_problems + 1000:
            raise ValueError(f"could not draw {num_problems} distinct problems (got {len(rows)})")
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- loading

def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def hub_reachable(timeout: float = 3.0, host: str = "huggingface.co") -> bool:
    """False when offline mode is set (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``); else whether a TCP
    connection to the hub opens within ``timeout`` seconds (name lookup included: it runs in a thread).
    The connection is tried once per process (the answer is kept)."""
    if _truthy("HF_HUB_OFFLINE") or _truthy("HF_DATASETS_OFFLINE"):
        return False
    return _probe(host, timeout)


@functools.lru_cache(maxsize=None)
def _probe(host: str, timeout: float) -> bool:
    result = []

    def connect():
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def generated_split(split: str, seed: int = 0) -> list[dict[str, str]]:
    """The generated stand-in for a GSM8K split: GSM8K's sizes, the test questions never in train."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"split must be one of {', '.join(SPLIT_SIZES)}, got {split!r}")
    pool = generate_word_problems(SPLIT_SIZES["test"] + SPLIT_SIZES["train"], seed)
    return pool[:SPLIT_SIZES["test"]] if split == "test" else pool[SPLIT_SIZES["test"]:]


def load_gsm8k(split: str = "train", source: str = "auto", num_problems: int | None = None, seed: int = 0,
               timeout: float = 3.0):
    """GSM8K's ``split`` as a ``datasets.Dataset`` with columns ``question`` and ``answer``.

    ``source``: ``"hub"`` loads ``openai/gsm8k`` (``main``) with ``datasets.load_dataset``; ``"generated"``
    makes the stand-in (:func:`generated_split`, seeded); ``"auto"`` tries the hub only when it is
    allowed and answers within ``timeout`` seconds (:func:`hub_reachable`), and falls back to the
    generated set otherwise or if loading fails. ``ds.info.description`` says which one you got.
    ``num_problems`` keeps the first that many rows.
    """
    from datasets import Dataset, DatasetInfo, load_dataset

    if source not in ("auto", "hub", "generated"):
        raise ValueError(f"source must be 'auto', 'hub' or 'generated', got {source!r}")
    if split not in SPLIT_SIZES:
        raise ValueError(f"split must be one of {', '.join(SPLIT_SIZES)}, got {split!r}")
    ds = None
    if source == "hub" or (source == "auto" and hub_reachable(timeout)):
        try:
            ds = load_dataset("openai/gsm8k", "main", split=split)
        except Exception:  # noqa: BLE001 - auto mode: any failure (network, cache, auth) falls back
            if source == "hub":
                raise
    if ds is None:
        info = DatasetInfo(description=f"minigrpo generated word problems in GSM8K's format ({split}, seed {seed})")
        ds = Dataset.from_list(generated_split(split, seed), info=info)
    if num_problems is not None:
        ds = ds.select(range(min(num_problems, len(ds))))
    return ds


# ----------------------------------------------------------------------------- formats and rewards

def extract_hash_answer(text: str) -> str | None:
    """The final answer of a GSM8K solution: what follows the last ``####`` (None without one)."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip()


def extract_answer(completion: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` of a completion, stripped (None without one)."""
    found = _ANSWER.findall(completion)
    return found[-1].strip() if found else None


def normalize_number(text: str | None) -> str | None:
    """``"$1,234.00"`` → ``"1234"``: a number written canonically, or None for what is not a number."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


def sft_target(answer: str) -> str:
    """A GSM8K answer as the completion SFT imitates: the reasoning (annotations dropped) in the tag format."""
    reasoning, final = answer.rsplit("####", 1) if "####" in answer else (answer, "")
    lines = [line.strip() for line in _CALCULATOR.sub("", reasoning).strip().splitlines() if line.strip()]
    return "<think>\n" + "\n".join(lines) + f"\n</think>\n<answer>{final.strip()}</answer>"


def format_prompt(question: str, conversational: bool = False, system_prompt: str | None = SYSTEM_PROMPT):
    """The prompt for a question: a conversation (system + user) or a string (system prompt, blank line, question)."""
    if conversational:
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return system + [{"role": "user", "content": question}]
    return f"{system_prompt}\n\n{question}\n" if system_prompt else f"{question}\n"


def prepare_gsm8k(dataset, conversational: bool = False, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict]:
    """GSM8K rows as GRPO rows: ``prompt`` (:func:`format_prompt`), ``answer`` (the number) and ``solution``
    (:func:`sft_target`). Works on a ``datasets.Dataset`` or a list of ``{"question", "answer"}`` dicts."""
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    return [{"prompt": format_prompt(r["question"], conversational, system_prompt),
             "answer": extract_hash_answer(r["answer"]) or r["answer"].strip(),
             "solution": sft_target(r["answer"])} for r in rows]


def correctness_reward(prompts: list, completions: list, answer: list, **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the number in ``<answer>...</answer>`` equals the ``answer`` column, else 0.0.

    The column may hold the number or a whole GSM8K solution (its ``#### n`` is read); numbers are
    compared written canonically (``"1,200"`` = ``"1200.0"``).
    """
    out = []
    for completion, reference in zip(completions, answer):
        reference = str(reference)
        expected = normalize_number(extract_hash_answer(reference) if "####" in reference else reference)
        given = normalize_number(extract_answer(completion_text(completion)))
        out.append(float(given is not None and given == expected))
    return out


def format_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """TRL reward function: 1.0 for ``<think>…</think>`` then ``<answer>number</answer>`` and nothing else, else 0.0."""
    out = []
    for completion in completions:
        m = _FORMAT.fullmatch(completion_text(completion))
        out.append(float(m is not None and normalize_number(m.group("answer")) is not None))
    return out


def gsm8k_task(train_size: int | None = None, eval_size: int = 200, conversational: bool | None = None,
               system_prompt: str | None = SYSTEM_PROMPT, source: str = "auto", seed: int = 0, tokenizer=None,
               max_completion_length: int | None = None, format_weight: float = 0.1):
    """A :class:`~minigrpo.llm.data.DatasetTask` on GSM8K (or its generated stand-in): train split to train,
    the first ``eval_size`` test problems held out; rewards ``correctness_reward`` + ``format_weight`` ·
    ``format_reward``; SFT imitates ``solution``. ``conversational=None``: conversations when ``tokenizer`` has
    a chat template. ``max_completion_length=None``: 1.25 × the longest solution in tokens (with a
    tokenizer; 320 without one)."""
    from minigrpo.llm.data import DatasetTask

    if conversational is None:
        conversational = getattr(tokenizer, "chat_template", None) is not None
    train = prepare_gsm8k(load_gsm8k("train", source, train_size, seed), conversational, system_prompt)
    test = prepare_gsm8k(load_gsm8k("test", source, eval_size, seed), conversational, system_prompt)
    if max_completion_length is None:
        max_completion_length = 320
        if tokenizer is not None:
            longest = max(len(tokenizer.encode(r["solution"], add_special_tokens=False)) for r in train[:2000])
            max_completion_length = int(1.25 * longest) + 1
    return DatasetTask(train, [correctness_reward, format_reward], reward_weights=[1.0, format_weight],
                       eval_dataset=test, answer_column="solution", correctness_func="correctness_reward",
                       format_func="format_reward", max_completion_length=max_completion_length,
                       tokenizer=tokenizer, name="gsm8k")


__all__ = ["ALPHABET", "SPLIT_SIZES", "SYSTEM_PROMPT", "TEMPLATES", "correctness_reward", "extract_answer",
           "extract_hash_answer", "format_prompt", "format_reward", "generate_word_problems", "generated_split",
           "gsm8k_task", "hub_reachable", "load_gsm8k", "normalize_number", "prepare_gsm8k", "sft_target",
           "word_problem"]
