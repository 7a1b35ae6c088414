"""SGLang frontend programs of the kinds SGLang's own test_programs.py exercises, run at T = 0."""

from __future__ import annotations

import sglang as sgl


@sgl.function
def few_shot_qa(s, question):
    s += "Questions with short answers.\n\nQ: What is the capital of France?\nA: Paris\n"
    s += "Q: What is the capital of Italy?\nA: Rome\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", stop="\n", max_tokens=16, temperature=0)


@sgl.function
def true_or_false(s, statement):
    s += "Is the statement True or False?\nStatement: Fire is cold.\nAnswer: False\n"
    s += "Statement: " + statement + "\nAnswer:" + sgl.select("answer", ["True", "False"])


@sgl.function
def city_json(s):
    s += "Describe Paris as a JSON object.\n"
    s += sgl.gen("json", max_tokens=48, temperature=0,
                 regex=r'\{"name": "[A-Za-z ]{1,20}", "country": "[A-Za-z ]{1,20}", "population": [0-9]{1,9}\}')


@sgl.function
def phone_regex(s):
    s += "Write a phone number in the format 555-123-4567: "
    s += sgl.gen("phone", max_tokens=16, temperature=0, regex=r"[0-9]{3}-[0-9]{3}-[0-9]{4}")


@sgl.function
def parallel_tips(s, topic):
    s += f"Give two tips about {topic}.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=24, stop="\n", temperature=0)
    s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"] + "\n"


@sgl.function
def story(s):
    s += sgl.user("Tell a two-sentence story about a robot.")
    s += sgl.assistant(sgl.gen("story", max_tokens=40, temperature=0))


def run_all(url: str) -> dict:
    """Run every program against the server at `url`; returns their results as plain data."""
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    out = {}
    out["few_shot"] = [few_shot_qa.run(question=q)["answer"] for q in ("What is the capital of Japan?",
                                                                         "What is the capital of Spain?")]
    out["batch"] = [r["answer"] for r in few_shot_qa.run_batch([{"question": "What is 2 + 2?"},
                                                                {"question": "What color is the sky?"}])]
    out["select"] = [true_or_false.run(statement=x)["answer"] for x in ("Water is wet.", "The sun is cold.")]
    out["json"] = city_json.run()["json"]
    out["regex"] = phone_regex.run()["phone"]
    out["fork"] = parallel_tips.run(topic="sleep").text()
    state = story.run(stream=True)
    out["stream"] = "".join(state.text_iter("story"))
    return out
