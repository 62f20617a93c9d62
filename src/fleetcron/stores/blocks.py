"""The loader of statement files: named blocks, ``-- name: x`` then the block's text.

SQL files (``sql/<dialect>/queries.sql``) and the Redis scripts (``redis/scripts.lua``)
are both read with it; ``--`` starts a comment in both languages.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["Block", "load_blocks"]

_NAME = re.compile(r"^--\s*name:\s*([a-z_]+)\s*$", re.MULTILINE)
_USES = re.compile(r"^--\s*uses:\s*(.*)$", re.MULTILINE)


class Block:
    """One named block: its ``text`` (comment-only lines kept or not, as loaded) and the
    blocks it ``uses`` (a ``-- uses: a, b`` line), to be put before it."""

    __slots__ = ("name", "text", "uses")

    def __init__(self, name: str, text: str, uses: tuple[str, ...]) -> None:
        self.name = name
        self.text = text
        self.uses = uses


def load_blocks(package: str, *path: str, keep_comments: bool = False) -> dict[str, Block]:
    """Read the named blocks of the file at ``path`` inside ``package``."""
    text = resources.files(package).joinpath(*path).read_text()
    parts = _NAME.split(text)
    blocks: dict[str, Block] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        uses_line = _USES.search(body)
        uses = tuple(u.strip() for u in uses_line.group(1).split(",")) if uses_line else ()
        lines = body.strip().splitlines()
        if not keep_comments:
            lines = [line for line in lines if not line.lstrip().startswith("--")]
        else:
            lines = [line for line in lines if not _USES.fullmatch(line)]
        blocks[name] = Block(name, "\n".join(lines).strip(), uses)
    return blocks
