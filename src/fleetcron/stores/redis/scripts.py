"""The Redis scripts, read from ``scripts.lua`` (leases, the run ledger, replicas),
``queue.lua`` (the work queue) and ``checkpoints.lua`` (checkpoints) beside this module.

Each script is its named block with the blocks it ``uses`` put before it (the server's
clock as ``now``; the run ledger's row helpers; the queue's keys and helpers). Comments
stay in: they document the script's KEYS, ARGV and reply where it is read, and a script is
sent to the server once.

A script that returns a row returns a flat list; its header declares the list's layout
once, with the column names of the SQL stores::

    -- row lease: {name, holder, fence, acquired_us, expires_us, min_until_us, now_us}

(a declaration may go on over comment lines until its ``}``). :data:`REPLY_ROWS` holds
every declared layout, by name; the operations decode a reply with the record's decoder
(:mod:`fleetcron.stores.rows`) and those names. A layout declared in several scripts is
the same in each.
"""

from __future__ import annotations

import re

from fleetcron.stores.blocks import Block, load_blocks

__all__ = ["REPLY_ROWS", "SCRIPTS", "SCRIPT_BLOCKS"]

_PRELUDES = ("now", "ledger", "queue")
_FILES = ("scripts.lua", "queue.lua", "checkpoints.lua")


def _load() -> dict[str, Block]:
    blocks: dict[str, Block] = {}
    for file in _FILES:
        found = load_blocks("fleetcron.stores.redis", file, keep_comments=True)
        # One namespace of names across the files: a block of one may use one of another.
        clash = sorted(blocks.keys() & found.keys())
        if clash:
            raise RuntimeError(f"{file} redefines Redis script block(s) {', '.join(clash)}")
        blocks.update(found)
    return blocks


SCRIPT_BLOCKS: dict[str, Block] = _load()


def _compose(block: Block) -> str:
    parts = [SCRIPT_BLOCKS[name].text for name in block.uses] + [block.text]
    return "\n".join(parts) + "\n"


SCRIPTS: dict[str, str] = {
    name: _compose(block) for name, block in SCRIPT_BLOCKS.items() if name not in _PRELUDES
}
"""Script name → its full Lua text."""


_ROW = re.compile(r"^--\s*row\s+([a-z_]+):\s*\{([^}]*)\}", re.MULTILINE)
_COLUMN = re.compile(r"[a-z_]+")


def _reply_rows(blocks: dict[str, Block]) -> dict[str, tuple[str, ...]]:
    layouts: dict[str, tuple[str, ...]] = {}
    for block in blocks.values():
        for match in _ROW.finditer(block.text):
            name = match.group(1)
            columns = tuple(
                column.strip() for column in match.group(2).replace("--", " ").split(",")
            )
            if not all(_COLUMN.fullmatch(column) for column in columns):
                raise RuntimeError(f"script {block.name}: row {name} declares {columns}")
            if layouts.setdefault(name, columns) != columns:
                raise RuntimeError(
                    f"script {block.name} declares row {name} as {columns}, another script "
                    f"as {layouts[name]}"
                )
    return layouts


REPLY_ROWS: dict[str, tuple[str, ...]] = _reply_rows(SCRIPT_BLOCKS)
"""Row layout name (``-- row NAME: {…}``) → its column names, in the reply's order."""
