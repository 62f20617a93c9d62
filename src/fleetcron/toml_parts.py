"""A large TOML document read a few hundred tables at a time.

``tomllib`` parses a whole document at once, and the parse of a jobs file of 100,000 jobs
peaks at about 240 MB of Python objects (the document itself is 95 MB) — memory the
process keeps once it has been used. :func:`parts` cuts the text before the headers of
the tables under one key (``[jobs.NAME]``) and parses each part on its own, so only one
part's objects are alive at a time, however long the file.

A part parses on its own exactly as it does in the whole document when the cut is between
two statements; a cut anywhere else (a line of a multi-line string or array that happens
to start like a header) leaves the part before it unterminated, so it fails to parse.
What the parts cannot see of each other is checked instead: a name under the split key
defined in two parts, a key outside it after the first part, the split key or a bare
``[key]`` header where the parts would merge what the whole document refuses. Any of these
raises :class:`Unsplittable`, after which the caller reads the document whole — the same
answer and the same error messages as always, only without the bound on memory.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from typing import Any

__all__ = ["TABLES_PER_PART", "Unsplittable", "parts"]

TABLES_PER_PART = 500
"""Tables under the split key per part (a part of a jobs file is about 70 KB of text)."""

# A table header of one key (bare, "basic" or 'literal'): a top-level table defined
# explicitly, which the whole document refuses to define twice.
_BARE_HEADER = re.compile(
    r"""^[ \t]*\[[ \t]*(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')[ \t]*\]""",
    re.MULTILINE,
)


class Unsplittable(Exception):
    """The document cannot be read in parts: read it whole."""


def parts(text: str, key: str, *, per_part: int | None = None) -> Iterator[dict[str, Any]]:
    """The documents of ``text``'s parts, in order. The first holds everything before the
    first ``[key.NAME]`` table header at the start of a line, each next one ``per_part``
    such tables (default :data:`TABLES_PER_PART`) and whatever follows them before the
    next cut; after the first, a part holds only tables under ``key`` or under other
    keys that the first part does not hold. Merged, the parts are the document.

    Raises :class:`Unsplittable` — possibly after some parts were yielded — where reading
    in parts could differ from reading the whole: a part that does not parse, a name
    under a top-level key in two parts, a part after the first holding a top-level key
    that the first holds or that is not a table, a bare ``[name]`` header after the first
    cut."""
    header = re.compile(rf"^\[{re.escape(key)}\.", re.MULTILINE)
    cuts = [match.start() for match in header.finditer(text)][:: per_part or TABLES_PER_PART]
    if not cuts:
        yield _parse(text)
        return
    if _BARE_HEADER.search(text, cuts[0]):
        raise Unsplittable(f"a [name] header after the first [{key}.NAME] table")
    seen: dict[str, set[str]] = {}
    head: set[str] = set()
    for number, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(text)], strict=True)):
        document = _parse(text[start:end])
        for name, value in document.items():
            if number == 0:
                head.add(name)
            elif name in head or not isinstance(value, dict):
                raise Unsplittable(f"{name!r} after the first part")
            names = seen.setdefault(name, set())
            if isinstance(value, dict):
                if not names.isdisjoint(value):
                    raise Unsplittable(f"a table under {name!r} in two parts")
                names.update(value)
        yield document


def _parse(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise Unsplittable("a part does not parse") from None
