"""Keeping the store's password out of what a run leaves behind.

A job runs as the user fleetcron runs as, so it can read the store's password wherever
fleetcron can (its command line, its environment, a password file) and print it. What a
run prints or raises is stored in the ledger (output tail, error) and logged (the
daemon's echo of the output, its log lines), so each such text goes through a
:class:`Scrubber` built from the backend URL first. Each occurrence of a *secret*
becomes ``***``:

- the full URL, when it carries a password;
- each password it carries (userinfo, ``password=`` query values), as written and
  percent-decoded, when it is at least :data:`MIN_SECRET_LENGTH` characters long. A
  shorter one is too common a string to replace everywhere (a password ``a`` would mask
  every ``a`` of the output): only the URL holding it is masked.

A bounded text (the output's last 4 KiB) is scrubbed as a stream *before* it is cut
(:class:`ScrubbingStream`), so the cut never leaves part of a secret behind; a text cut
by somebody else (:meth:`Scrubber.scrub` with ``cut=True``) has a trailing start of a
password masked too.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from dataclasses import replace

from fleetcron.models import RunOutcome
from fleetcron.stores.url import url_passwords

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "Scrubber",
    "ScrubbingStream",
    "credentials",
    "scrubber_for",
]

MASK = "***"
MIN_SECRET_LENGTH = 4


def credentials(backend_url: str | None) -> tuple[str, ...]:
    """Every form of every password ``backend_url`` carries: as written and
    percent-decoded (``+`` also read as a space, as in a query)."""
    forms: dict[str, None] = {}
    for password in url_passwords(backend_url or ""):
        decoded = (urllib.parse.unquote(password), urllib.parse.unquote_plus(password))
        forms.update(dict.fromkeys(form for form in (password, *decoded) if form))
    return tuple(forms)


def _start_at_end(text: str, secret: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``secret``."""
    for index in range(max(0, len(text) - len(secret) + 1), len(text)):
        if secret.startswith(text[index:]):
            return len(text) - index
    return 0


class Scrubber:
    """Replaces the secrets of one backend URL with ``***`` (see the module's docstring);
    a URL without a password gives a scrubber that changes nothing."""

    __slots__ = ("_passwords", "_pattern", "_reveal", "_url", "secrets")

    def __init__(self, backend_url: str | None) -> None:
        passwords = credentials(backend_url)
        self._url = backend_url if backend_url and passwords else ""
        self._passwords = passwords
        # The URL's first _reveal characters tell nothing secret: its first password starts there.
        self._reveal = min((self._url.find(p) for p in passwords if p in self._url), default=0)
        wanted = {p for p in passwords if len(p) >= MIN_SECRET_LENGTH}
        if self._url:
            wanted.add(self._url)
        self.secrets = tuple(sorted(wanted, key=lambda s: (-len(s), s)))
        """What is replaced wherever it occurs, longest first."""
        self._pattern = re.compile("|".join(map(re.escape, self.secrets))) if wanted else None

    def scrub(self, text: str, *, cut: bool = False) -> str:
        """``text`` with each secret replaced by ``***``. ``cut``: ``text`` was cut short
        at its end, so an end that starts a password (or the URL past its password's
        start) is replaced too."""
        if self._pattern is None:
            return text
        text = self._pattern.sub(MASK, text)
        if cut:
            url_partial = _start_at_end(text, self._url)
            ends = [_start_at_end(text, p) for p in self._passwords]
            partial = max([*ends, url_partial if url_partial > self._reveal else 0])
            if partial:
                text = text[: len(text) - partial] + MASK
        return text

    def outcome(self, outcome: RunOutcome) -> RunOutcome:
        """``outcome`` with its error and output scrubbed."""
        if self._pattern is None:
            return outcome
        return replace(
            outcome,
            error=None if outcome.error is None else self.scrub(outcome.error),
            output=None if outcome.output is None else self.scrub(outcome.output),
        )

    def safe_end(self, text: str) -> int:
        """How much of ``text`` can be scrubbed and passed on as it is now: up to an end
        that could start a secret, and never into a secret that runs on past there."""
        end = len(text) - max((_start_at_end(text, s) for s in self.secrets), default=0)
        if self._pattern is not None and end < len(text):
            for match in self._pattern.finditer(text):
                if match.start() < end < match.end():
                    return match.start()
                if match.start() >= end:
                    break
        return end


@functools.lru_cache(maxsize=16)
def scrubber_for(backend_url: str | None) -> Scrubber:
    """The :class:`Scrubber` of ``backend_url``, made once: a scheduler scrubs every run's
    outcome with the same one, and making it parses the URL and compiles a pattern."""
    return Scrubber(backend_url)


class ScrubbingStream:
    """Scrubs a text that arrives in pieces: an end of a piece that could be the start of
    a secret is held back until the next piece (or the end of the text) says what it is.
    Only such an end is held: a piece that ends a line is passed on whole (unless a
    password holds a newline), so echoing the text line by line is not delayed."""

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._held = ""

    def feed(self, piece: str) -> str:
        """The scrubbed text that can be passed on now."""
        if not self._scrubber.secrets:
            return piece
        text = self._held + piece
        end = self._scrubber.safe_end(text)
        self._held = text[end:]
        return self._scrubber.scrub(text[:end])

    def close(self, *, cut: bool = False) -> str:
        """What is still held back, scrubbed. ``cut``: the text did not end here (it was
        no longer read), so a start of a password is masked too."""
        held, self._held = self._held, ""
        return self._scrubber.scrub(held, cut=cut)
