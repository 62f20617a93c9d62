"""The Redis scripts, read from ``scripts.lua`` (leases, the run ledger, replicas),
``queue.lua`` (the work queue) and ``checkpoints.lua`` (checkpoints) beside this module.

Each script is its named block with the blocks it ``uses`` put before it (the server's
clock as ``now``; the run ledger's row helpers; the queue's keys and helpers). Comments
stay in: they document the script's KEYS, ARGV and reply where it is read, and a script is
sent to the server once.
"""

from __future__ import annotations

from fleetcron.stores.blocks import Block, load_blocks

__all__ = ["SCRIPTS", "SCRIPT_BLOCKS"]

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
