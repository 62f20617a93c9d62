"""The Redis scripts, read from ``scripts.lua`` beside this module.

Each script is its named block with the blocks it ``uses`` put before it (the server's
clock as ``now``; the run ledger's row helpers). Comments stay in: they document the
script's KEYS, ARGV and reply where it is read, and a script is sent to the server once.
"""

from __future__ import annotations

from fleetcron.stores.blocks import Block, load_blocks

__all__ = ["SCRIPTS", "SCRIPT_BLOCKS"]

_PRELUDES = ("now", "ledger")

SCRIPT_BLOCKS: dict[str, Block] = load_blocks(
    "fleetcron.stores.redis", "scripts.lua", keep_comments=True
)


def _compose(block: Block) -> str:
    parts = [SCRIPT_BLOCKS[name].text for name in block.uses] + [block.text]
    return "\n".join(parts) + "\n"


SCRIPTS: dict[str, str] = {
    name: _compose(block) for name, block in SCRIPT_BLOCKS.items() if name not in _PRELUDES
}
"""Script name → its full Lua text."""
