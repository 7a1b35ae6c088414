"""Prompt sets for training and evaluating the draft model.

Training prompts are built from templates of the four task kinds the project serves (chat/instructions,
GSM8K-style arithmetic word problems, code requests, opinion/feedback questions), with a fixed seed.
The held-out prompts are written by hand, with subjects and phrasings that the templates do not use;
`held_out_prompts()` checks that none of them appears in the training set.
"""

from __future__ import annotations

import random

KINDS = ("chat", "math", "code", "opinion")

_TOPICS = [
    "the water cycle", "photosynthesis", "black holes", "the French Revolution", "machine learning",
    "the stock market", "climate change", "the human immune system", "volcanoes", "the internet",
    "renewable energy", "the Roman Empire", "DNA", "gravity", "electric cars", "the moon landing",
    "coffee", "sleep", "meditation", "inflation", "recycling", "honeybees", "the printing press",
    "earthquakes", "vaccines", "the Great Wall of China", "rainbows", "democracy", "blockchain",
    "the solar system", "ocean tides", "the Renaissance", "antibiotics", "cloud computing",
    "plate tectonics", "the Olympic Games", "jazz music", "the periodic table", "supply and demand",
    "the Amazon rainforest", "nuclear energy", "social media", "the human brain", "time zones",
]
_ACTIVITIES = [
    "studying for exams", "learning a new language", "running a marathon", "saving money",
    "cooking healthy meals", "public speaking", "starting a small business", "traveling on a budget",
    "staying focused while working from home", "growing tomatoes", "writing a novel",
    "improving sleep", "learning to play the guitar", "making new friends in a new city",
    "preparing for a job interview", "reducing stress", "keeping a houseplant alive",
    "organizing a closet", "training a puppy", "taking better photos with a phone",
]
_PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "storage"), ("a lake", "a pond"),
    ("speed", "velocity"), ("a crocodile", "an alligator"), ("baking soda", "baking powder"),
    ("a comet", "an asteroid"), ("stocks", "bonds"), ("a simile", "a metaphor"),
    ("Python", "JavaScript"), ("an ocean", "a sea"), ("a democracy", "a republic"),
    ("mass", "weight"), ("a hurricane", "a tornado"), ("TCP", "UDP"),
]
_ANIMALS = [
    "octopuses", "penguins", "elephants", "owls", "dolphins", "cats", "bats", "ants", "giraffes",
    "sharks", "frogs", "koalas", "crows", "horses", "butterflies", "wolves",
]
_PEOPLE = ["my manager", "a colleague", "my landlord", "a customer", "my teacher", "a neighbor", "my team"]
_SUBJECTS = [
    "a delayed project", "a meeting next week", "a broken heater", "a refund request", "a thank you",
    "a schedule change", "a new policy", "a missed deadline",
]
_CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.", "Write a short poem about {topic}.",
    "Give me three tips for {activity}.", "What is the difference between {a} and {b}?",
    "Summarize the main ideas of {topic} in a few sentences.", "Tell me a fun fact about {animal}.",
    "Write a short email to {person} about {subject}.", "How can I get better at {activity}?",
    "What are the pros and cons of {topic}?", "Describe {topic} to a ten-year-old.",
    "Write a haiku about {animal}.", "List five interesting facts about {topic}.",
    "Can you help me make a plan for {activity}?", "Why is {topic} important?",
    "Write a short story about {animal} who loves {activity}.", "What is {topic}?",
    "Hi! Can you tell me something about {topic}?", "Give me a step-by-step guide to {activity}.",
]

_NAMES = [
    "Maria", "John", "Aisha", "Tom", "Lena", "Carlos", "Mei", "Sam", "Priya", "Omar", "Julia", "Ben",
    "Sofia", "Liam", "Nora", "Ravi",
]
_ITEMS = [
    "apples", "pencils", "stickers", "cookies", "marbles", "books", "eggs", "cards", "balloons",
    "oranges", "toy cars", "cupcakes",
]
_MATH_TEMPLATES = [
    "{n1} has {a} {item}. {n1} buys {b} more and then gives {c} to {n2}. How many {item} does {n1} have now?",
    "A store sells {item} for ${p} each. {n1} buys {a} of them and pays with a ${big} bill. How much change does {n1} get?",
    "{n1} reads {a} pages every day. How many pages does {n1} read in {b} weeks?",
    "A train travels at {s} miles per hour for {h} hours. How far does it travel?",
    "{n1} earns ${w} per hour and works {h} hours a day for {d} days. How much money does {n1} earn?",
    "There are {a} students in a class. {pct}% of them are girls. How many boys are in the class?",
    "{n1} baked {a} {item} and packed them equally into {d} boxes. How many {item} are in each box, and how many are left over?",
    "A rectangle is {a} cm long and {b} cm wide. What is its area and its perimeter?",
    "{n1} is {a} years old. {n2} is {b} years older than {n1}. How old will {n2} be in {c} years?",
    "A farmer has {a} chickens and {b} cows. How many legs do the animals have in total?",
    "{n1} saves ${w} every week. How many weeks does it take {n1} to save ${big}?",
    "A recipe needs {c} cups of flour for {d} cookies. How many cups are needed for {a} cookies?",
    "What is {a} times {b}, minus {c}?", "Solve for x: {d}x + {c} = {a}.",
    "{n1} had ${big}. {n1} spent ${a} on a jacket and half of the rest on shoes. How much money is left?",
    "A tank holds {a} liters of water. It leaks {d} liters per hour. How many liters are left after {h} hours?",
]
_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the factorial of n",
    "counts the vowels in a string", "finds the largest element in a list", "removes duplicates from a list",
    "computes the Fibonacci sequence up to n", "checks whether a word is a palindrome",
    "sorts a list of dictionaries by a key", "reads a CSV file and prints each row",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "computes the average of a list of numbers",
    "returns the second smallest number in a list", "counts how often each word appears in a text",
    "flattens a nested list", "checks whether two strings are anagrams", "implements binary search",
    "capitalizes the first letter of every word", "returns the sum of the digits of a number",
    "finds the longest word in a sentence", "checks whether a year is a leap year",
    "converts a decimal number to binary", "returns all even numbers from a list",
    "computes the greatest common divisor of two numbers", "rotates a list by k positions",
    "validates a password for length and digits", "counts the lines in a file",
]
_LANGS = ["Python", "JavaScript", "Java", "C", "Rust", "Go"]
_CODE_SNIPPETS = [
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)",
    "def f(xs):\n    return [x * x for x in xs if x > 0]",
    "total = 0\nfor n in numbers:\n    total += n\nprint(total / len(numbers))",
    "with open('data.txt') as fh:\n    lines = fh.readlines()\nprint(len(lines))",
    "d = {}\nfor w in text.split():\n    d[w] = d.get(w, 0) + 1",
    "x = [1, 2, 3]\ny = x\ny.append(4)\nprint(x)",
]
_CODE_TEMPLATES = [
    "Write a Python function that {task}.", "How do I write a function in {lang} that {task}?",
    "Explain what this code does:\n```python\n{snippet}\n```", "Write a {lang} program that {task}.",
    "Can you show me an example of a function that {task}, with comments?",
    "What is a simple way to {task2} in Python?", "Is there a bug in this code?\n```python\n{snippet}\n```",
    "Write unit tests for a function that {task}.",
]
_CODE_TASKS2 = [
    "read a JSON file", "sort a dictionary by value", "get the current date", "make an HTTP request",
    "remove whitespace from a string", "iterate over two lists at once", "handle exceptions",
    "create a class with a constructor", "write to a text file", "generate random numbers",
]

_OPINION_TOPICS = [
    "remote work", "electric cars", "online learning", "social media for teenagers", "a four-day work week",
    "video games", "homework", "fast food", "space exploration", "learning to code in school",
    "living in a big city", "reading paper books instead of e-books", "pineapple on pizza",
    "artificial intelligence in art", "owning a dog", "public transport", "working at a startup",
    "wearing school uniforms", "vegetarian diets", "self-checkout machines", "tiny houses",
    "smartwatches", "learning music as a child", "cash-free shops", "gap years before university",
    "open-plan offices", "tipping in restaurants", "reality TV", "online dating", "studying abroad",
    "minimalism", "buying a used car", "getting up early", "group projects at school",
]
_DRAFTS = [
    "I think we should meet on Monday to talk about the plan.",
    "Our product is the best because it is cheap and fast and everyone likes it.",
    "Dear team, the deadline is moved. Please finish your work soon.",
    "My essay argues that cities should plant more trees to cool the streets in summer.",
    "Hello, I am writing to apply for the job of assistant at your company.",
    "The movie was good but too long, and the ending was confusing.",
]
_OPINION_TEMPLATES = [
    "What do you think about {otopic}?", "Is {otopic} a good idea? Why or why not?",
    "Can you give me feedback on this sentence: \"{draft}\"", "Should I choose {a} or {b}?",
    "What are the arguments for and against {otopic}?", "How could I improve this text? \"{draft}\"",
    "Do you think {otopic} will become more common in the future?",
    "I'm not sure about {otopic}. Can you help me decide?", "Rate this opening line and suggest a better one: \"{draft}\"",
    "My friend loves {otopic} but I don't. Who is right?", "Give me your honest opinion on {otopic}.",
    "Write a short argument in favor of {otopic}.", "What would be the biggest downside of {otopic}?",
    "Please review my paragraph and tell me what works and what doesn't: \"{draft}\"",
]


def _fill(kind: str, template: str, rng: random.Random) -> str:
    a, b = rng.choice(_PAIRS)
    n1, n2 = rng.sample(_NAMES, 2)
    values = {
        "topic": rng.choice(_TOPICS), "activity": rng.choice(_ACTIVITIES), "a": a, "b": b,
        "animal": rng.choice(_ANIMALS), "person": rng.choice(_PEOPLE), "subject": rng.choice(_SUBJECTS),
        "task": rng.choice(_CODE_TASKS), "task2": rng.choice(_CODE_TASKS2), "lang": rng.choice(_LANGS),
        "snippet": rng.choice(_CODE_SNIPPETS), "otopic": rng.choice(_OPINION_TOPICS),
        "draft": rng.choice(_DRAFTS), "n1": n1, "n2": n2, "item": rng.choice(_ITEMS),
    }
    if kind == "math":
        values.update(a=rng.randint(12, 90), b=rng.randint(2, 30), c=rng.randint(1, 11))
    values.update(
        p=rng.randint(2, 9), big=rng.choice([50, 100, 200]), s=rng.randint(30, 80), h=rng.randint(2, 9),
        w=rng.randint(8, 30), d=rng.randint(2, 8), pct=rng.choice([20, 25, 40, 50, 60, 75]),
    )
    return template.format(**values)


def training_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` distinct (kind, prompt) pairs, kinds in rotation chat/math/code/opinion; deterministic in seed."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = random.Random(seed)
    templates = {"chat": _CHAT_TEMPLATES, "math": _MATH_TEMPLATES, "code": _CODE_TEMPLATES,
                 "opinion": _OPINION_TEMPLATES}
    held = {p for _, p in HELD_OUT}
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    misses = dict.fromkeys(KINDS, 0)
    turn = 0
    while len(out) < n:
        live = [k for k in KINDS if misses[k] < 500]  # a kind whose combinations are used up drops out
        if not live:
            raise ValueError(f"cannot build {n} distinct prompts from the templates")
        kind = live[turn % len(live)]
        prompt = _fill(kind, rng.choice(templates[kind]), rng)
        if prompt in seen or prompt in held:
            misses[kind] += 1
            continue
        turn += 1
        seen.add(prompt)
        out.append((kind, prompt))
    return out


# Hand-written, never produced by the templates above (checked in held_out_prompts()).
HELD_OUT: list[tuple[str, str]] = [
    ("chat", "What causes the seasons on Earth?"),
    ("chat", "Write a limerick about a forgetful wizard."),
    ("chat", "How does a refrigerator keep food cold?"),
    ("chat", "Give me a packing list for a weekend camping trip."),
    ("chat", "Explain how a bill becomes a law in the United States."),
    ("chat", "What should I cook tonight if I only have rice, eggs and spinach?"),
    ("chat", "Describe the life cycle of a star."),
    ("chat", "Write a birthday message for my grandmother who is turning 90."),
    ("chat", "Why do leaves change color in the fall?"),
    ("chat", "Suggest a name for a bakery that sells only bread."),
    ("math", "A bus has 48 seats. 17 people get on at the first stop and 22 at the second. How many seats are still empty?"),
    ("math", "Kevin buys 3 notebooks at $4 each and 2 pens at $1.50 each. How much does he spend?"),
    ("math", "A garden is 15 meters long and 8 meters wide. How much fencing is needed to go around it?"),
    ("math", "If 5 workers build a wall in 12 days, how many days would 3 workers need?"),
    ("math", "Anna scored 78, 85 and 92 on three tests. What is her average score?"),
    ("math", "A shirt costs $40 and is on sale for 15% off. What is the sale price?"),
    ("math", "There are 120 marbles in a jar; one third are red and a quarter are blue. How many are neither?"),
    ("math", "A car uses 6 liters of fuel per 100 km. How much fuel does it need for 350 km?"),
    ("math", "Peter walks 2.5 km to school and back every day. How far does he walk in a 5-day week?"),
    ("math", "What is 17 squared plus 3 cubed?"),
    ("code", "Write a SQL query that returns the ten most recent orders from an orders table."),
    ("code", "How do I center a div horizontally and vertically with CSS?"),
    ("code", "Write a bash script that renames every .txt file in a folder to .md."),
    ("code", "What does the yield keyword do in Python? Show a small example."),
    ("code", "Implement a stack class in Python with push, pop and peek methods."),
    ("code", "Why does my Python loop print the same closure value three times?\n```python\nfs = [lambda: i for i in range(3)]\nprint([f() for f in fs])\n```"),
    ("code", "Write a regular expression that matches a valid email address and explain it."),
    ("code", "How can I measure how long a function takes to run in Python?"),
    ("code", "Write a JavaScript function that debounces another function."),
    ("code", "Explain the difference between a list and a tuple in Python."),
    ("opinion", "Is it worth learning Latin today?"),
    ("opinion", "What is your opinion on daylight saving time?"),
    ("opinion", "Here is my cover letter opening: 'I have always loved numbers.' Is it strong enough?"),
    ("opinion", "Would you rather live by the sea or in the mountains, and why?"),
    ("opinion", "My friend says breakfast is the most important meal of the day. Do you agree?"),
    ("opinion", "Please give feedback on my slogan for a gym: 'Sweat now, smile later.'"),
    ("opinion", "Are self-driving cars safe enough to use on public roads?"),
    ("opinion", "Is it better to rent or to buy a house when you are young?"),
    ("opinion", "What do you think of schools banning phones in classrooms?"),
    ("opinion", "I wrote this tweet: 'Mondays are just Sundays that forgot to relax.' Is it funny?"),
]


def held_out_prompts() -> list[tuple[str, str]]:
    """The 40 hand-written evaluation prompts (10 per kind); raises if any is also a training prompt."""
    train = {p for _, p in training_prompts(4000, seed=0)}
    overlap = [p for _, p in HELD_OUT if p in train]
    if overlap:
        raise ValueError(f"held-out prompts also in the training set: {overlap}")
    return list(HELD_OUT)
