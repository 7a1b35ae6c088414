"""The `--ssd-*` flag table of README.md, generated from where the flags are declared.

The draft settings' rows come from the `DraftSettings` dataclass (`sglang_ssd/wire/settings.py`: each
field's default and help text), the launch-only rows from the launcher's argument group
(`add_ssd_arguments`). The table sits between ``<!-- flags:begin -->`` and ``<!-- flags:end -->`` in
README.md; ``tests/test_readme.py`` fails when it differs from what this script prints.

    python bench/readme_flags.py            # rewrite the table in README.md
    python bench/readme_flags.py --check    # exit 1 if README.md's table is stale
    python bench/readme_flags.py --print    # print the table
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.readme_blocks import write_block  # noqa: E402
from sglang_ssd.target.defaults import LAUNCH_DEFAULTS  # noqa: E402
from sglang_ssd.target.ssd_config import add_ssd_arguments  # noqa: E402
from sglang_ssd.wire.settings import DraftSettings  # noqa: E402

README = ROOT / "README.md"
NAME = "flags"
PREFIX = "--ssd-"

# Meanings of the launch-only flags whose declaration carries no help text.
LAUNCH_HELP = {
    "--ssd-draft-device": "device of the draft server the launcher starts: cpu or cuda:N",
    "--ssd-draft-endpoint": "use a running draft server (tcp:// or ipc://) instead of starting one; "
                            "repeat to spread requests over several",
    "--ssd-draft-timeout": "seconds a draft server may stay silent before rounds go on without speculation "
                           "(still exact); the link reconnects when it answers",
}  # fmt: skip


def _shown(value) -> str:
    if value is None or value == "" or value == []:
        return "unset"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flag_rows() -> list[tuple[str, str, str]]:
    """(flag, default, meaning) for every `--ssd-*` flag of the launcher, settings first."""
    rows = []
    for f in fields(DraftSettings):
        default = _shown(f.default if f.default is not MISSING else None)
        default = LAUNCH_DEFAULTS.get(f.name, default)
        rows.append((PREFIX + f.name.replace("_", "-"), default, f.metadata["help"]))
    settings = {r[0] for r in rows}
    parser = argparse.ArgumentParser(add_help=False)
    add_ssd_arguments(parser)
    for action in parser._actions:
        flag = next((s for s in action.option_strings if s.startswith(PREFIX)), None)
        if flag is None or flag in settings:
            continue
        meaning = action.help or LAUNCH_HELP.get(flag)
        if not meaning:
            raise SystemExit(f"{flag}: no help text; add one to its declaration or to LAUNCH_HELP in {__file__}")
        rows.append((flag, _shown(action.default), meaning))
    return rows


def flag_table() -> str:
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    lines += [f"| `{flag}` | {_cell(default)} | {_cell(meaning)} |" for flag, default, meaning in flag_rows()]
    return "\n".join(lines)


def readme_table(readme: Path = README) -> str | None:
    """The table now between the markers of ``readme`` (None without them)."""
    text = readme.read_text()
    begin, end = f"<!-- {NAME}:begin -->", f"<!-- {NAME}:end -->"
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs")
    ap.add_argument("--print", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    table = flag_table()
    if args.print:
        print(table)
        return 0
    if args.check:
        ok = readme_table() == table
        print("README.md flag table: " + ("current" if ok else "stale (run python bench/readme_flags.py)"))
        return 0 if ok else 1
    return 0 if write_block(NAME, table, README) else 1


if __name__ == "__main__":
    raise SystemExit(main())
