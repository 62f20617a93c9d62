"""What the security tests fuzz with: text rich in the metacharacters of SQL (quotes,
``--``, ``/*``, ``%``/``_``, placeholders), Lua and Redis (``KEYS``/``ARGV``, patterns,
``{}`` hash tags, glob characters), shells (``$()``, backticks, ``;``, ``|``), Unicode
that a case-insensitive, accent-insensitive or PAD SPACE collation would fold, and
lengths at the limits — plus the rule a name must satisfy, written from the docstring of
:mod:`fleetcron.names` (not by calling it), so the tests check the product against it.
"""

from __future__ import annotations

import os
import unicodedata
import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fleetcron.models import job_lease_name
from fleetcron.names import MAX_NAME_LENGTH

__all__ = [
    "ARG_PIECES",
    "PIECES",
    "arguments",
    "budget",
    "fuzz",
    "job_names",
    "lookalikes",
    "name_problems",
    "names",
    "namespace_splits",
    "nfc",
    "raw_names",
    "unique_base",
]

# Fragments a store, a Lua script or a shell might treat as more than text.
# fmt: off
PIECES: tuple[str, ...] = (
    # SQL: quotes, comments, LIKE wildcards, every driver's placeholder style, statements
    "'", '"', "\\", ";", "--", "/*", "*/", "#", "%", "_", "%%", "%s", "%(name)s", "?", "$1",
    ":name", "@fc_now", "'; DROP TABLE fleetcron_lease; --", '" OR "1"="1', "0x00", "\\0",
    "\\x00", "\\u0000", "NULL", "\\N", "CHAR(0)",
    # Lua, Redis keys and glob patterns, the key layout's own separators and prefixes
    "KEYS[1]", "ARGV[1]", "redis.call('FLUSHALL')", "%a", "%d+", ".-", "[%w]", "{", "}",
    "{x}", "}{", "{1:", "*", "?", "[", "]", "^", "fleetcron:", "fleetcron:job:", ":", "::",
    "}:job", ":run:1", ":slots", "fleetcron:replicas",
    # shells
    "$(", ")", "$(id)", "`", "`id`", "${IFS}", "|", "&&", ">", "<", "~", "!", "&",
    # paths and URLs
    "/", "..", "./", "%2F", "%00", "+",
    # Unicode a collation or a normalisation might fold into something else
    "\u00a0", "\u200b", "\ufeff", "\u2028", "\u202e", "\u3000", "é", "e\u0301", "\u212b",
    "ß", "ss", "ẞ", "İ", "ı", "ﬁ", "Ａ", "Ω", "🔒", "😀", "名", "\U0010fffd", "a", "A", "z",
)
# fmt: on
_FILLERS = ("a", "Z", "名", "🔒", "%", "'", "}", "_")  # NFC-stable, never whitespace

_CONTROL = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)]))  # category Cc
_char = st.characters(codec="utf-8", exclude_characters=_CONTROL)
_piece = st.one_of(st.sampled_from(PIECES), st.text(_char, min_size=1, max_size=4))
raw_names = st.lists(_piece, min_size=1, max_size=6).map("".join)
"""Text made of metacharacter pieces: often a valid name, sometimes not (whitespace)."""


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def name_problems(text: str, *, limit: int = MAX_NAME_LENGTH) -> set[str]:
    """What makes ``text`` a name no store must be asked to hold (``names.py``'s rules):
    each entry is a fragment the refusal's message must contain one of. Empty: valid."""
    if not text:
        return {"empty"}
    normal = nfc(text)
    problems = set()
    if len(normal) > limit:
        problems.add("maximum")
    if any(unicodedata.category(c) == "Cs" for c in normal):
        problems.add("not valid UTF-8")
    if any(unicodedata.category(c) == "Cc" for c in normal):
        problems.add("control character")
    if normal != normal.strip():
        problems.add("whitespace")
    return problems


def _clean(text: str) -> str:
    return nfc("".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cs"))).strip()


def _fit(text: str, filler: str, limit: int) -> str:
    """``text`` cut or padded with ``filler`` to exactly ``limit`` characters."""
    cut = _clean(text)[:limit].rstrip()
    return cut + filler * (limit - len(cut))


def names(limit: int = MAX_NAME_LENGTH) -> st.SearchStrategy[str]:
    """Valid names (already NFC): short ones of metacharacters, and ones of exactly
    ``limit`` characters — of 4-byte characters too, the widest a store must hold."""
    short = raw_names.map(_clean)
    longest = st.builds(_fit, raw_names, st.sampled_from(_FILLERS), st.just(limit))
    return st.one_of(short, short, longest).filter(lambda n: not name_problems(n, limit=limit))


def job_names() -> st.SearchStrategy[str]:
    """Valid job names whose job lease (``fleetcron:job:<job>``) is a valid lease name too.

    A longer job name is what ``test_known_bug_job_lease_name.py`` is about; leaving it out
    here keeps that one defect from failing every fuzz test of the ledger."""
    return names().filter(lambda job: not name_problems(job_lease_name(job)))


def unique_base() -> str:
    """A namespace prefix of its own for each example (9 characters)."""
    return "s" + uuid.uuid4().hex[:8]


def lookalikes(name: str) -> list[str]:
    """Names that a case- or accent-insensitive, PAD SPACE or ignorable-character collation,
    a LIKE pattern or a sloppy key builder would take for ``name``; all distinct from it
    (after NFC) unless canonically equivalent (``NFD``: the same lock by design)."""
    stripped = "".join(
        c for c in unicodedata.normalize("NFD", name) if not unicodedata.combining(c)
    )
    forms = [
        name.upper(),
        name.lower(),
        name.casefold(),
        name.swapcase(),
        unicodedata.normalize("NFKC", name),
        unicodedata.normalize("NFD", name),
        stripped,
        name.replace("ß", "ss"),
        name.replace("%", "_"),
        name.replace("_", "%"),
        name + "\u200b",
        name + "\u00a0x",
        name + "}",
        "{" + name + "}",
        name.replace(":", "::"),
        name + "*",
    ]
    return [form for form in forms if form]


def namespace_splits(namespace: str, name: str) -> list[tuple[str, str]]:
    """Every other way to split ``namespace:name`` at a colon into a namespace and a name:
    the pairs a key built as ``ns + ":" + name`` would confuse."""
    joined = f"{namespace}:{name}"
    return [
        (joined[:i], joined[i + 1 :])
        for i, char in enumerate(joined)
        if char == ":" and i != len(namespace)
    ]


# -- command arguments --------------------------------------------------------------------------
# fmt: off
ARG_PIECES: tuple[str, ...] = (
    "", " ", "--", "-", "-v", "--backend", "--backend=sqlite:///pwned.db",
    "--backend=sqlite:////pwned.db", "--namespace=x",
    "-- true", "$HOME", "${PATH}", "*", "?", "~", "a b", "'", '"', "\\", "\n", "\t", "'\"'",
    "$(touch pwned)", "`touch pwned`", "; touch pwned", "| touch pwned", "&& touch pwned",
    "> pwned", "< /etc/passwd", "%s%n", "{}", "!!", "\\x00", "名前 🔒", "\u202e", "=",
)
# fmt: on


def _no_nul(text: str) -> bool:
    return "\x00" not in text


arguments = st.lists(
    st.one_of(
        st.sampled_from(ARG_PIECES),
        st.lists(st.sampled_from(ARG_PIECES + PIECES), max_size=4).map("".join),
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
        # bytes that are not UTF-8, as argv may hold them (decoded as Python decodes argv)
        st.binary(min_size=1, max_size=6).filter(lambda b: b"\x00" not in b).map(os.fsdecode),
        st.sampled_from(("x" * 4000, "名" * 2000)),
    ).filter(_no_nul),
    max_size=8,
)
"""A command's arguments (after ``--``): anything argv can hold (everything but NUL)."""


def budget(backend_url: str, *, sql: int, fast: int) -> int:
    """How many examples on this backend: ``fast`` in memory; ``sql`` on the stores that
    do I/O — a write commits to disk (SQL), a listing SCANs the whole keyspace (Redis)."""
    return fast if backend_url.startswith("memory:") else sql


def fuzz(max_examples: int) -> settings:
    """Settings for a fuzz test: few examples (the stores are real, some runs spawn the
    CLI), no deadline, nothing saved in the working tree, fixtures shared by examples."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )
