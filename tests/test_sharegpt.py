"""ShareGPT first-turn prompts: the lenient reader and the fixed split."""

import json

import pytest

from sglang_ssd import sharegpt
from sglang_ssd.sharegpt import (
    HELD_OUT,
    conversation_of,
    first_turn,
    later_turns,
    load_sharegpt,
    read_conversations,
)


def _conv(cid: str, human: str, reply: str = "ok", first: str = "human") -> dict:
    return {"id": cid, "conversations": [{"from": first, "value": human}, {"from": "gpt", "value": reply}]}


def test_reader_keeps_complete_conversations_before_the_cut():
    convs = [_conv(f"c{i}", f"question number {i}") for i in range(5)]
    text = json.dumps(convs, indent=2)
    cut = text[: text.index('"c4"') + 10]  # the last conversation ends mid-string
    got, dropped = read_conversations(cut)
    assert [c["id"] for c in got] == ["c0", "c1", "c2", "c3"]
    assert dropped > 0
    whole, dropped = read_conversations(text)
    assert len(whole) == 5 and dropped == 0


def test_first_turn_needs_a_human_opening_with_a_reply():
    assert first_turn(_conv("a", "  hello there  ")) == "hello there"
    assert first_turn(_conv("b", "hi", first="gpt")) is None
    assert first_turn({"id": "c", "conversations": [{"from": "human", "value": "alone"}]}) is None
    assert first_turn({"id": "d"}) is None


@pytest.fixture
def small_file(tmp_path):
    convs = [_conv(f"id{i}", f"a real question, number {i}") for i in range(HELD_OUT + 40)]
    convs += [_conv("short", "hi"), _conv("long", "x" * (sharegpt.MAX_CHARS + 1)), _conv("id0", "duplicate id")]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs)[:-200])  # cut short, like the packaged file
    return path


def test_split_is_disjoint_fixed_and_filters(small_file):
    held = load_sharegpt("held_out", path=small_file)
    train = load_sharegpt("train", path=small_file)
    assert len(held) == HELD_OUT
    assert not {p.id for p in held} & {p.id for p in train}
    ids = {p.id for p in held + train}
    assert "short" not in ids and "long" not in ids
    # Fixed by the id alone: the same prompts whatever order the file lists them in.
    assert [p.id for p in load_sharegpt("held_out", limit=3, path=small_file)] == [p.id for p in held[:3]]


def _talk(cid: str, *turns: str) -> dict:
    """A conversation alternating human and gpt, starting with the human."""
    return {"id": cid, "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t}
                                         for i, t in enumerate(turns)]}  # fmt: skip


def test_later_turns_are_the_humans_answered_messages_after_the_first():
    conv = _talk("a_0", "first question", "answer", "  second question ", "answer 2", "last, unanswered")
    assert later_turns(conv) == [(2, "second question")]
    assert later_turns(_talk("b_0", "only one", "answer")) == []
    assert later_turns({"id": "c"}) == []
    assert conversation_of("abc_12") == "abc" and conversation_of("abc") == "abc"


def test_later_turns_never_come_from_a_held_out_conversation(tmp_path):
    # Two segments of each conversation: x<i>_0 and x<i>_1. Whichever segment's first turn is held out,
    # no later turn of either segment may be trained on.
    convs = []
    for i in range(HELD_OUT + 40):
        for seg in (0, 1):
            convs.append(_talk(f"x{i}_{seg}", f"opening question {i}/{seg}", "reply",
                               f"follow-up question {i}/{seg}", "reply"))  # fmt: skip
    path = tmp_path / "segments.json"
    path.write_text(json.dumps(convs))
    held = {conversation_of(p.id) for p in load_sharegpt("held_out", path=path)}
    later = load_sharegpt("train_later", path=path)
    got = {conversation_of(p.id.split("#")[0]) for p in later}
    assert later and not got & held
    assert got == {f"x{i}" for i in range(HELD_OUT + 40)} - held
    assert all(p.prompt.startswith("follow-up") and p.reply == "reply" for p in later)
    # a fixed order, whatever the file's order
    path.write_text(json.dumps(convs[::-1]))
    sharegpt._split.cache_clear()
    assert [p.id for p in load_sharegpt("train_later", path=path)] == [p.id for p in later]


def test_bad_part_and_limit_are_one_line_errors(small_file):
    with pytest.raises(ValueError, match="part must be one of"):
        load_sharegpt("test", path=small_file)
    with pytest.raises(ValueError, match="limit"):
        load_sharegpt("train", limit=-1, path=small_file)


def test_packaged_file_has_the_documented_split():
    held = load_sharegpt("held_out")
    train = load_sharegpt("train")
    assert len(held) == HELD_OUT and len(train) > 9000
    assert not {p.id for p in held} & {p.id for p in train}
    later = load_sharegpt("train_later")
    assert len(later) > 40_000
    assert not {conversation_of(p.id) for p in held} & {conversation_of(p.id.split("#")[0]) for p in later}


def test_bench_file_is_the_held_out_part_in_bench_servings_format(small_file, tmp_path):
    from sglang.benchmark.datasets.sharegpt import sample_sharegpt_requests

    out = tmp_path / "bench.json"
    assert sharegpt.write_bench_file(out, path=small_file) == HELD_OUT
    rows = json.loads(out.read_text())  # complete JSON, unlike the packaged file
    held = load_sharegpt("held_out", path=small_file)
    assert [r["id"] for r in rows] == [p.id for p in held]
    assert all(r["conversations"][1] == {"from": "gpt", "value": "ok"} for r in rows)

    class Tok:  # bench_serving only needs encode() from its tokenizer here
        bos_token = None

        def encode(self, text):
            return text.split()

    got = sample_sharegpt_requests(str(out), 8, Tok(), fixed_output_len=16)
    assert len(got) == 8 and {r.prompt for r in got} <= {p.prompt for p in held}
