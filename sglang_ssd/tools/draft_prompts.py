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


def _draw(n: int, seed: int, fill, rejected, max_misses: int, family: str) -> list[tuple[str, str]]:
    """`n` distinct (kind, prompt) pairs, kinds in rotation chat/math/code/opinion, ``fill(kind, rng)`` drawing
    each prompt and ``rejected(prompt)`` skipping some; a kind that misses ``max_misses`` times (its
    combinations used up) drops out. Deterministic in seed."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    misses = dict.fromkeys(KINDS, 0)
    turn = 0
    while len(out) < n:
        live = [k for k in KINDS if misses[k] < max_misses]
        if not live:
            raise ValueError(f"cannot build {n} distinct prompts from the {family}")
        kind = live[turn % len(live)]
        prompt = fill(kind, rng)
        if prompt in seen or rejected(prompt):
            misses[kind] += 1
            continue
        turn += 1
        seen.add(prompt)
        out.append((kind, prompt))
    return out


def training_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` distinct (kind, prompt) pairs of the first family, never a hand-written one; deterministic in seed."""
    templates = {"chat": _CHAT_TEMPLATES, "math": _MATH_TEMPLATES, "code": _CODE_TEMPLATES,
                 "opinion": _OPINION_TEMPLATES}
    held = {p for _, p in HELD_OUT}
    return _draw(n, seed, lambda kind, rng: _fill(kind, rng.choice(templates[kind]), rng), held.__contains__, 500,
                 "templates")


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


# --- The second template family ("templates-b") -------------------------------------------------------
# The first family runs out of distinct chat, code and opinion prompts after about 1,000 (its later parts
# are mostly arithmetic). This family adds longer requests with a stated audience, length or format, the
# shapes users write and the first family lacks. Its own stream, so the first family's parts (and their
# stored answers) stay as they are. No prompt shares a six-word run with an evaluation prompt.

_B_CONCEPTS = [
    "how a vaccine trains the immune system", "why the sky is blue", "how a credit score works",
    "what causes ocean waves", "how a search engine ranks pages", "why bread rises",
    "how glaciers shape valleys", "what a neural network is", "how interest on a loan adds up",
    "why we have leap years", "how a heat pump warms a house", "what a black hole is",
    "how bees make honey", "why iron rusts", "how a bicycle stays upright", "what inflation does to savings",
    "how noise-cancelling headphones work", "why cats purr", "how a compass finds north",
    "what the greenhouse effect is", "how an election is counted", "why onions make you cry",
    "how solar panels make electricity", "what an API is", "how the heart pumps blood",
    "why some metals are magnetic", "how a password manager keeps secrets", "what a recession is",
    "how coral reefs form", "why we dream", "how GPS knows where you are", "what a mortgage is",
]
_B_AUDIENCES = [
    "a ten-year-old", "my grandmother", "a first-year student", "a busy manager", "someone who has never heard of it",
    "a high-school class", "a friend who hates science",
]
_B_LENGTHS = ["in three sentences", "in under 100 words", "in one short paragraph", "as a numbered list",
              "with one everyday example", "without any jargon"]
_B_CITIES = ["Rome", "Kyoto", "Prague", "Barcelona", "Vienna", "Istanbul", "Edinburgh", "Mexico City", "Seoul",
             "Amsterdam", "Budapest", "Cape Town"]
_B_OCCASIONS = [
    ("my sister", "her graduation"), ("a coworker", "their retirement"), ("my neighbor", "watering my plants"),
    ("my coach", "a great season"), ("an old friend", "their new baby"), ("my teacher", "a reference letter"),
    ("the hotel staff", "a pleasant stay"), ("my uncle", "his sixtieth birthday"),
]
_B_REQUESTS = [
    ("my boss", "to work from home on Fridays"), ("the city council", "to fix a dangerous crossing"),
    ("a shop", "for a refund on a broken blender"), ("my landlady", "to allow a small cat"),
    ("a professor", "for an extension on an essay"), ("the gym", "to cancel my membership"),
    ("a client", "to move our call to next week"), ("my neighbors", "to keep the noise down after ten"),
]
_B_THINGS = ["breakfasts", "board games for two", "habits for a calmer morning", "ways to reuse glass jars",
             "questions to ask at a job interview", "indoor plants for low light", "stretches for desk workers",
             "cheap date ideas", "podcasts topics for beginners", "ways to save on groceries",
             "rainy-day activities for kids", "things to check before buying a used bike"]
_B_PARAGRAPHS = [
    "Our school started a recycling club in September. Students collect paper and bottles every Friday and "
    "sell them to a local plant. The money paid for new books for the library.",
    "The bridge in the old town was closed for repairs for two years. Shops nearby lost customers, but the new "
    "bridge is wider and has a lane for bicycles.",
    "Mia wanted to run a marathon, so she trained four times a week for six months. On race day it rained, but "
    "she finished in just under five hours and raised money for charity.",
    "The museum added an evening opening on Thursdays. Tickets are cheaper after six, and the cafe stays open "
    "late. Visitor numbers on Thursdays doubled within a month.",
    "A small bakery switched to selling only in the mornings. The owner now bakes less, throws away almost no "
    "bread, and has more time for her family.",
]
_B_SCENES = ["a harbor at dawn", "an empty train station at night", "autumn leaves on a bike path",
             "a thunderstorm over the city", "a cat asleep in the sun", "the smell of fresh coffee",
             "a kite on a windy beach", "the last day of summer holidays"]
_B_CHAT = [
    "Explain {concept} to {audience}, {length}.", "Can you describe {concept} {length}?",
    "I never understood {concept}. Could you explain it {length}?",
    "Write a warm thank-you message to {who} for {why}.", "Write a brief, friendly email asking {whom} {ask}.",
    "Draft a polite message to {whom} asking {ask}. Keep it under five sentences.",
    "I have {days} days in {city}. Suggest a relaxed plan for each day.",
    "Plan a {days}-day trip to {city} for someone on a tight budget.",
    "List {count} {things}.", "Suggest {count} {things}, with one line on each.",
    "Summarize this in one sentence: \"{paragraph}\"", "Give this text a short title and a one-line summary: \"{paragraph}\"",
    "Write a four-line poem about {scene}.", "Write a haiku about {scene}.",
    "How do I say no to {whom} asking me {ask2} without sounding rude?",
]
_B_ASK2 = ["to lend them money", "to work this weekend", "to join a new committee", "to host the family dinner",
           "to help them move house"]
_B_MATH = [
    "{n1} has {a} {item}. {n1} gives a quarter of them to {n2} and then buys {c} more. How many {item} does {n1} have?",
    "A shop sells {item} at ${p} each or {d} for ${q}. How much does {n1} save by buying {d} at once instead of one at a time?",
    "{n1} runs {d} km on weekdays and {h} km on each day of the weekend. How far does {n1} run in {b} weeks?",
    "A class of {a} students goes on a trip. Each bus holds {w} students. How many buses are needed?",
    "A jacket costs ${big}. It is marked down by {pct}%, and then {n1} uses a $5 coupon. What does {n1} pay?",
    "{n1} is {d} times as old as {n2}. {n2} is {c} years old. How old will {n1} be in {h} years?",
    "A pizza has {e} slices. {d} friends each eat 2 slices. How many slices are left?",
    "A water tank is filled at {d} liters per minute. How many minutes does it take to fill {a} liters?",
    "{n1} bought {d} shirts at ${w} each and a pair of shoes for ${s}. How much did {n1} spend in all?",
    "A garden is {a} m long and {b} m wide. A path of 1 m runs along the inside of the fence. What area is left for plants?",
    "{n1} saves {pct}% of a ${big} weekly wage. How much does {n1} save in {b} weeks?",
    "A movie starts at {h}:15 and lasts {d} hours and {s} minutes. At what time does it end?",
    "The sum of two numbers is {a} and their difference is {c}. What are the two numbers?",
    "{n1} types {s} words per minute. How long does a {a}00-word essay take to type?",
    "A baker uses {c} eggs for every {d} cakes. How many eggs for {a} cakes?",
    "There are {a} red and {b} blue beads in a bag. What fraction of the beads are blue?",
]
_B_FUNCS = [
    ("count_words", "counts the words in a sentence"), ("is_even", "tells whether a number is even"),
    ("to_title", "turns a sentence into title case"), ("unique_sorted", "returns the sorted unique items of a list"),
    ("chunk", "splits a list into chunks of size n"), ("safe_divide", "divides two numbers and returns None on division by zero"),
    ("median", "returns the median of a list of numbers"), ("char_counts", "counts each character in a string"),
    ("clamp", "limits a number to a given range"), ("last_n_lines", "returns the last n lines of a text file"),
    ("dedupe_keep_order", "removes duplicates but keeps the first occurrence order"),
    ("is_sorted", "checks whether a list is sorted"), ("word_lengths", "maps each word to its length"),
    ("snake_to_camel", "converts snake_case names to camelCase"), ("running_total", "returns the running totals of a list"),
]
_B_SNIPPETS = [
    ("def add_item(item, items=[]):\n    items.append(item)\n    return items", "it keeps old items between calls"),
    ("for i in range(1, 10):\n    print(i)", "it should print 1 to 10"),
    ("nums = [1, 2, 3]\nfor n in nums:\n    if n == 2:\n        nums.remove(n)\nprint(nums)", "it skips elements"),
    ("x = input('number: ')\nprint(x + 1)", "it crashes"),
    ("def mean(xs):\n    return sum(xs) / len(xs)", "it fails on an empty list"),
    ("words = text.split(' ')\nprint(len(words))", "it miscounts when there are double spaces"),
    ("import json\ndata = json.load('config.json')", "it raises an error"),
]
_B_TABLES = [("employees", "salary above 50000"), ("orders", "were placed in 2023"), ("books", "have more than 300 pages"),
             ("students", "scored above 90"), ("products", "are out of stock"), ("users", "signed up last month")]
_B_TOOLS = ["a list comprehension", "a dictionary", "a set", "a generator", "f-strings", "the with statement",
            "a lambda", "enumerate", "zip", "a decorator", "a class method", "try/except"]
_B_CODE = [
    "Write a Python function `{fname}` that {fdoc}.", "Write a Python function `{fname}` that {fdoc}. Add a docstring and two examples.",
    "In {lang}, write a function that {fdoc}.", "Write a Python function that {fdoc}, and explain how it works.",
    "Fix this code, {why}:\n```python\n{code}\n```", "Explain why {why} here:\n```python\n{code}\n```",
    "Write a SQL query that lists all {table} that {cond}.", "Write a SQL query that counts the {table} that {cond}.",
    "When should I use {tool} in Python? Give a short example.", "Show a small Python example of {tool} and explain it.",
]
_B_PLANS = [
    "learn Spanish with an app for 10 minutes a day and watch one film a week", "cycle to work three days a week",
    "wake up at 6 to write for an hour before work", "cook all my lunches on Sunday for the whole week",
    "read one book a month by reading on my commute", "run a 10 km race in eight weeks, starting from zero",
    "save for a holiday by putting aside $50 every payday", "learn to draw by copying one photo every evening",
    "study for my driving test with one lesson and two practice tests a week", "stop using my phone after 9 pm",
    "meditate for five minutes after lunch", "practice piano for twenty minutes before dinner",
    "walk 10,000 steps a day by taking the stairs and walking to the shops",
]
_B_IDEAS = [
    "opening a small coffee cart near a university", "selling my old clothes online", "moving to a smaller town",
    "taking a year off to travel", "starting a podcast about local history", "switching careers to nursing at 35",
    "buying an electric scooter for commuting", "teaching my kids to cook", "renting out a spare room",
    "going back to university part time", "joining a community choir", "learning to sail at 50",
    "giving up my car and using a bike", "homeschooling for one year", "building a website for my band",
    "adopting two kittens instead of one", "keeping chickens in the garden", "working four long days instead of five",
    "writing a family cookbook", "volunteering at an animal shelter every Saturday",
]
_B_COMPARE = [("trains", "planes for short trips"), ("paper notes", "note-taking apps"), ("gas stoves", "induction hobs"),
              ("private schools", "public schools"), ("leasing a car", "buying one"), ("e-books", "audiobooks"),
              ("shared offices", "working from a cafe"), ("city parks", "private gardens")]
_B_LINES = [
    "It was the kind of morning that made promises it could not keep.",
    "Nobody in our village had ever seen snow in May.",
    "We sell shoes that remember your feet.",
    "Fresh bread, every morning, from people who care.",
    "The letter arrived twenty years late.", "Good coffee, no rush.", "My grandfather collected clocks that never worked.",
    "Clean energy for every home on the street.", "The dog knew before any of us did.",
]
_B_OPINION = [
    "Review my plan: I want to {plan}. Is it realistic, and what would you change?",
    "Here is my goal: {plan}. What problems might I run into?", "What do you think of {idea}?",
    "I am thinking about {idea}. What should I consider first?", "Is {idea} a good idea for someone with little money?",
    "What are the pros and cons of {x} compared with {y}?", "Which is better, {x} or {y}? Explain briefly.",
    "Give me honest feedback on this line: \"{line}\"", "Is this a good opening for a story? \"{line}\"",
    "Would this work as a slogan? \"{line}\" Suggest two alternatives.",
]
# A closing instruction multiplies the distinct prompts of every kind; "" keeps the plain form common.
_B_SUFFIXES = {
    "chat": ["", "", " Please keep it short.", " Use simple words.", " Make it friendly."],
    "math": ["", "", " Show your steps.", " Explain your answer.", " Give only the final number."],
    "code": ["", "", " Keep it short.", " Include a short explanation.", " Use only the standard library."],
    "opinion": ["", "", " Please be honest.", " Answer in a few bullet points.", " Keep it brief.",
                " Give me both sides.", " I am a student, if that matters."],
}
_B_TEMPLATES = {"chat": _B_CHAT, "math": _B_MATH, "code": _B_CODE, "opinion": _B_OPINION}


def _fill_b(kind: str, template: str, rng: random.Random) -> str:
    who, why = rng.choice(_B_OCCASIONS)
    whom, ask = rng.choice(_B_REQUESTS)
    fname, fdoc = rng.choice(_B_FUNCS)
    code, cwhy = rng.choice(_B_SNIPPETS)
    table, cond = rng.choice(_B_TABLES)
    x, y = rng.choice(_B_COMPARE)
    n1, n2 = rng.sample(_NAMES, 2)
    d = rng.randint(2, 6)
    values = {
        "concept": rng.choice(_B_CONCEPTS), "audience": rng.choice(_B_AUDIENCES), "length": rng.choice(_B_LENGTHS),
        "who": who, "why": cwhy if kind == "code" else why, "whom": whom, "ask": ask, "ask2": rng.choice(_B_ASK2),
        "days": rng.randint(2, 5), "city": rng.choice(_B_CITIES), "count": rng.choice([3, 4, 5, 6, 8, 10]),
        "things": rng.choice(_B_THINGS), "paragraph": rng.choice(_B_PARAGRAPHS), "scene": rng.choice(_B_SCENES),
        "n1": n1, "n2": n2, "item": rng.choice(_ITEMS), "a": rng.randint(12, 96), "b": rng.randint(2, 12),
        "c": rng.randint(2, 15), "d": d, "e": rng.choice([8, 10, 12, 16]), "h": rng.randint(2, 9),
        "p": rng.randint(2, 9), "q": rng.randint(5, 30), "w": rng.randint(8, 45), "s": rng.randint(20, 80),
        "big": rng.choice([60, 80, 120, 200, 250]), "pct": rng.choice([10, 15, 20, 25, 30, 40]),
        "fname": fname, "fdoc": fdoc, "lang": rng.choice(_LANGS), "code": code, "table": table, "cond": cond,
        "tool": rng.choice(_B_TOOLS), "plan": rng.choice(_B_PLANS), "idea": rng.choice(_B_IDEAS), "x": x, "y": y,
        "line": rng.choice(_B_LINES),
    }
    return template.format(**values)


def _six_word_runs(text: str) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i: i + 6]) for i in range(len(words) - 5)}


def _evaluation_runs() -> set[tuple[str, ...]]:
    from sglang_ssd.prompts import load_prompts

    texts = [p for _, p in HELD_OUT] + [p.prompt for p in load_prompts()]
    return set().union(*(_six_word_runs(t) for t in texts))


def training_prompts_b(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` distinct (kind, prompt) pairs of the second family, kinds in rotation; deterministic in seed.
    A prompt that shares a six-word run with a held-out or prompt-set prompt is skipped."""
    banned = _evaluation_runs()

    def fill(kind: str, rng: random.Random) -> str:
        return _fill_b(kind, rng.choice(_B_TEMPLATES[kind]), rng) + rng.choice(_B_SUFFIXES[kind])

    return _draw(n, seed, fill, lambda prompt: bool(_six_word_runs(prompt) & banned), 2000,
                 "second template family")
