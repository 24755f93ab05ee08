"""Generate the configuration table page, docs/config-table.md, from the pydantic schema in schemas/config.py.

The schema is the single source of truth for every config key: its default and its `description=`. This
script renders one table row per leaf field (nested sections expanded to dotted keys, in declaration order)
and writes the rows into docs/config-table.md between the `<!-- config-table:start -->` and
`<!-- config-table:end -->` markers, so the documented keys, defaults and meanings cannot drift from the code.

    python docs/config_table.py           # rewrite the table in place
    python docs/config_table.py --check   # exit 1, naming the first differing key, if the page is stale

A default that is machine-specific (an absolute path to the bundled assets) is rendered from the field's
`json_schema_extra={"doc_default": "..."}` text, verbatim; without one such a field is an error.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python docs/config_table.py`: sys.path[0] is docs/
    sys.path.insert(0, str(ROOT))

from docs.page_cli import page_main  # noqa: E402
from schemas.config import Config, Strict  # noqa: E402

PAGE = ROOT / "docs" / "config-table.md"
START = "<!-- config-table:start -->"
END = "<!-- config-table:end -->"
HEADER = ["| key | default | meaning |", "|---|---|---|"]


class TableError(Exception):
    """The page cannot be checked or rewritten (markers missing), or a field cannot be documented."""


def render_default(value: Any) -> str:
    """A default as YAML would spell it: `null`, `true`, `8`, `1.0`, `parquet`, `[]`."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, Path):
        if value.is_absolute():
            raise TableError(f"absolute path default {value}: give the field a json_schema_extra doc_default")
        text = str(value)
    elif isinstance(value, int | float):
        text = repr(value)
    else:
        text = json.dumps(value, default=str)
    return f"`{text}`"


def leaf_rows(section: Strict, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, rendered default, meaning) for every leaf field under `section`, in declaration order."""
    rows: list[tuple[str, str, str]] = []
    for name, field in type(section).model_fields.items():
        key = f"{prefix}{name}"
        value = getattr(section, name)
        if isinstance(value, Strict):
            rows.extend(leaf_rows(value, f"{key}."))
            continue
        if not field.description:
            raise TableError(f"`{key}` has no description in schemas/config.py")
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = str(extra["doc_default"]) if "doc_default" in extra else render_default(value)
        rows.append((key, default, field.description))
        if value is None and extra.get("doc_expand"):  # an optional section: its keys, as when it is given
            rows.extend(leaf_rows(optional_section(field.annotation)(), f"{key}."))
    return rows


def optional_section(annotation: Any) -> type[Strict]:
    """The section class of a `Section | None` field, whose keys the table lists under it."""
    return next(a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, Strict))


def table_lines(config: Config | None = None) -> list[str]:
    """The table's markdown lines (header included) for `config`'s values as defaults (default: Config())."""
    cells = [(f"`{key}`", default, meaning) for key, default, meaning in leaf_rows(config or Config())]
    return HEADER + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]


def split_page(text: str) -> tuple[str, list[str], str]:
    """(text through the start marker, non-blank lines between the markers, the rest from the end marker)."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise TableError(f"the page has no {START} ... {END} block")
    head = text[: start + len(START)]
    body = [line for line in text[len(head) : end].splitlines() if line.strip()]
    return head, body, text[end:]


def row_key(line: str) -> str:
    return line.strip("| ").split(" | ", 1)[0].strip("`")


def first_difference(current: list[str], wanted: list[str]) -> str | None:
    """A message naming the first key whose row differs (or is missing or extra); None when they agree."""
    for index in range(max(len(current), len(wanted))):
        have = current[index] if index < len(current) else None
        want = wanted[index] if index < len(wanted) else None
        if have == want:
            continue
        if want is None:
            return f"the page's row `{row_key(have or '')}` is not in the schema"
        if have is None:
            return f"`{row_key(want)}` is missing from the page's table"
        return f"`{row_key(want)}` differs: the page has\n  {have}\nschema gives\n  {want}"
    return None


def check(page: Path = PAGE) -> str | None:
    """None when `page`'s table matches the schema, else a message naming the first differing key."""
    _, body, _ = split_page(page.read_text())
    return first_difference(body, table_lines())


def write(page: Path = PAGE) -> bool:
    """Rewrite `page`'s table from the schema; True when the file changed."""
    text = page.read_text()
    head, _, tail = split_page(text)
    new = head + "\n\n" + "\n".join(table_lines()) + "\n\n" + tail
    if new != text:
        page.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    return page_main(__doc__, Path(__file__).name, check, write, PAGE, argv, errors=(TableError,))


if __name__ == "__main__":
    sys.exit(main())
