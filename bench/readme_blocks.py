"""The generated parts of bench/README.md: text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``,
rewritten by the script that measured it (the rest of the file is written by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def write_block(name: str, text: str, readme: Path = README) -> bool:
    """Replace block ``name`` with ``text``; False (and a note on stderr) if the markers are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = readme.read_text()
    if begin not in body or end not in body:
        print(f"{readme}: no {begin} block; {name} figures not written there", file=sys.stderr)
        return False
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    return True


def write_line(prefix: str, text: str, readme: Path = README) -> bool:
    """Replace the fixed-form line that starts with ``prefix`` (after its indent) by ``text``; False (and
    a note on stderr) if there is none."""
    lines = readme.read_text().split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith(prefix):
            lines[i] = line[: len(line) - len(line.lstrip())] + text
            readme.write_text("\n".join(lines))
            return True
    print(f"{readme}: no line starting {prefix!r}; not written there", file=sys.stderr)
    return False
