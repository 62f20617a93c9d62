"""HTML built from elements, escaped by construction.

``el("td", name)`` escapes ``name``; only :class:`Html` (what ``el`` returns, or a constant
the code wrote itself) goes through as is. No string from the store reaches a page
without passing here, so a job named ``<script>`` is shown, never run.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

__all__ = ["Html", "el", "join"]

_VOID = frozenset({"br", "input", "meta", "link", "hr", "img"})


class Html(str):
    """Markup that is already safe to send."""

    __slots__ = ()


def _child(child: object) -> str:
    if child is None or child is False:
        return ""
    if isinstance(child, Html):
        return child
    if isinstance(child, str | int | float):
        return html.escape(str(child), quote=False)
    if isinstance(child, Iterable):
        return "".join(_child(item) for item in child)
    raise TypeError(f"cannot render {type(child).__name__} as HTML")


def _attribute(key: str, value: object) -> str:
    name = key.rstrip("_").replace("_", "-")  # class_ -> class, aria_label -> aria-label
    if value is True:
        return f" {name}"
    return f' {name}="{html.escape(str(value), quote=True)}"'


def el(tag: str, *children: object, **attributes: object) -> Html:
    """``<tag attributes>children</tag>``; an attribute that is ``None`` or ``False`` is
    left out, one that is ``True`` is written bare (``required``)."""
    attrs = "".join(
        _attribute(key, value)
        for key, value in attributes.items()
        if value is not None and value is not False
    )
    if tag in _VOID:
        return Html(f"<{tag}{attrs}>")
    return Html(f"<{tag}{attrs}>{_child(children)}</{tag}>")


def join(*children: object) -> Html:
    """Children side by side, escaped as ``el`` escapes them."""
    return Html(_child(children))
