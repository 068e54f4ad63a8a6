"""The fixed built-in corpus the tiny model's BPE tokenizer is trained on.

Handwritten English plus text generated from a seeded :class:`random.Random`: Q&A, arithmetic,
countdown-style reasoning with ``<think>``/``<answer>`` tags, chat-like turns and invented names.
The same seed always yields the same lines, so the trained tokenizer is reproducible.
"""

from __future__ import annotations

import random

PASSAGES = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees.
The sun rises in the east and sets in the west. The moon orbits the Earth about once a month.
Plants use sunlight, water and carbon dioxide to make sugar; this process is called photosynthesis.
Please write a short answer. Keep it concise, clear and correct. Do not repeat the question.
She opened the window, looked at the garden and smiled: the roses were finally blooming.
Our team meets every Tuesday morning to review progress, discuss problems and plan the next week.
If you mix red and blue paint you get purple; yellow and blue make green.
The library closes at nine o'clock in the evening, but the reading room stays open until ten.
Mathematics is the language of patterns. Every even number greater than two is a sum of primes?
Nobody knows for sure, yet it's true for every number anyone has checked so far.
He said, "I'll be there in five minutes," and then he didn't show up for an hour.
They've already finished the report; we're still waiting for the final numbers from the lab.
Computers store numbers in binary, using only the digits zero and one.
A good recipe lists its ingredients first: flour, sugar, butter, eggs, milk and a pinch of salt.
Rivers carry water from mountains to the sea. The Nile and the Amazon are the longest rivers.
Learning a new language takes patience, practice and a lot of listening.
The train leaves at 7:45 from platform 3 and arrives at 10:20, so the trip takes 2 hours 35 minutes.
Model training improves the average reward while keeping answers short and accurate.
Evolution strategies sample perturbations, evaluate each member and move the mean toward the best.
Café, naïve, résumé, jalapeño, Zürich, São Paulo, Kraków, Ελλάδα, Москва, 東京, 北京, 서울.
Emoji 🙂 and symbols like €, £, ¥, ©, ™, ±, × and ÷ appear in real text too.
"""

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Brazil": "Brasilia",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Mexico": "Mexico City",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Poland": "Warsaw",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Russia": "Moscow",
    "Argentina": "Buenos Aires",
    "Portugal": "Lisbon",
    "Ireland": "Dublin",
    "Austria": "Vienna",
}

_WORDS_TEXT = """\
apple river mountain window garden teacher student doctor market city village ocean forest
cloud light music story letter question answer number problem reason result method system
energy power water stone paper table chair house family friend animal bird fish horse tiger
yellow green purple orange silver golden bright quiet happy careful simple strong gentle
walk run read write think count solve build carry follow explain measure compare choose
quickly slowly always never often really almost nearly together outside inside between
morning evening winter summer spring autumn yesterday tomorrow today minute second hour
computer program function variable value memory server request response adapter population
"""

_SYLLABLES_TEXT = "ka lo mi ra te su vo ne di pa zu ri mo sa le tu fe no gi ba"
WORDS = _WORDS_TEXT.split()
SYLLABLES = _SYLLABLES_TEXT.split()
OPS = ["+", "-", "*", "/"]


def _capital_lines(rng: random.Random) -> list[str]:
    lines = []
    for country, city in CAPITALS.items():
        lines.append(
            f"Q: What is the capital of {country}?\nA: The capital of {country} is {city}."
        )
        lines.append(f"{city} is the capital city of {country}.")
    rng.shuffle(lines)
    return lines


def _arithmetic_lines(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        op = rng.choice(OPS)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 2)}[op]
        style = rng.randrange(3)
        if style == 0:
            lines.append(f"Solve: {a} {op} {b} = {value}")
        elif style == 1:
            lines.append(f"What is {a} {op} {b}? The answer is {value}.")
        else:
            lines.append(f"Compute ({a} {op} {b}) and reply with a number only.\n{value}")
    return lines


def _countdown_lines(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
        a, b, c = nums[:3]
        target = a + b * c
        lines.append(
            f"Using the numbers {nums}, create an equation that equals {target}. "
            "You can use basic arithmetic operations (+, -, *, /) and each number can only be "
            "used once. Show your work in <think> </think> tags. And return the final answer in "
            f"<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.\n"
            f"<think> First, {b} * {c} = {b * c}. Then {a} + {b * c} = {target}. </think>\n"
            f"<answer> {a} + {b} * {c} </answer>"
        )
    return lines


def _word_lines(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        words = rng.sample(WORDS, rng.randint(5, 12))
        sentence = " ".join(words).capitalize()
        lines.append(sentence + rng.choice([".", "?", "!", ";", ":", ","]))
    return lines


def _name_lines(rng: random.Random, n: int) -> list[str]:
    """Invented names: many distinct, repeated subwords so the BPE target size is reached."""
    names = [
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()
        for _ in range(n)
    ]
    return [
        f"{name} met {rng.choice(names)} and {rng.choice(names)} in {name}ville." for name in names
    ]


def _chat_lines(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        topic = rng.choice(WORDS)
        lines.append(
            f"system\nYou are a helpful assistant.\nuser\nTell me about the {topic}.\n"
            f"assistant\nThe {topic} is {rng.choice(WORDS)} and {rng.choice(WORDS)}.\n"
        )
    return lines


def build_corpus(seed: int = 0) -> list[str]:
    """The training lines for the tokenizer; identical for the same ``seed``."""
    rng = random.Random(seed)
    lines = PASSAGES.splitlines()
    lines.append(" ".join(str(d) for d in range(10)) + "\n0123456789\n9876543210")
    lines += _capital_lines(rng)
    lines += _arithmetic_lines(rng, 400)
    lines += _countdown_lines(rng, 150)
    lines += _word_lines(rng, 400)
    lines += _name_lines(rng, 1500)
    lines += _chat_lines(rng, 100)
    return lines
