"""Validation of lock/job names and namespaces.

Names reach every store only as bound parameters, so quotes, ``;`` and ``--`` are harmless;
what is refused here is what a store cannot hold faithfully: empty names, NUL and other
control characters, surrounding whitespace (MySQL PAD SPACE collations) and names longer
than the key column. Names are normalised to Unicode NFC so that two spellings of one
name are one lock.
"""

from __future__ import annotations

import os
import unicodedata

from fleetcron.errors import ConfigurationError

__all__ = [
    "MAX_JOB_NAME_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_NAME_LENGTH",
    "NAMESPACE_ENV",
    "resolve_namespace",
    "validate_job_name",
    "validate_name",
    "validate_namespace",
]

MAX_NAME_LENGTH = 200
MAX_NAMESPACE_LENGTH = 64
# A job's runs are serialised by the lease "fleetcron:job:<job>" (models.job_lease_name),
# which must fit the name column too.
MAX_JOB_NAME_LENGTH = MAX_NAME_LENGTH - len("fleetcron:job:")


def _validate(value: object, *, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise ConfigurationError(f"{what} is empty")
    text = unicodedata.normalize("NFC", value)
    if len(text) > limit:
        raise ConfigurationError(
            f"{what} is {len(text)} characters long; the maximum is {limit}: {text[:40]!r}…"
        )
    for index, char in enumerate(text):
        category = unicodedata.category(char)
        if category == "Cs":  # a byte that was not UTF-8, as the OS hands argv over
            raise ConfigurationError(f"{what} {text!r} is not valid UTF-8 (position {index})")
        if category == "Cc":
            raise ConfigurationError(
                f"{what} {text!r} contains a control character at position {index}"
            )
    if text != text.strip():
        raise ConfigurationError(f"{what} {text!r} starts or ends with whitespace")
    return text


def validate_name(name: object, *, what: str = "lock name") -> str:
    """Return ``name`` normalised, or raise :class:`ConfigurationError` saying what is wrong."""
    return _validate(name, what=what, limit=MAX_NAME_LENGTH)


def validate_job_name(name: object, *, what: str = "job name") -> str:
    """Return a job name (of ``exec --schedule``, a trigger…) normalised, or raise
    :class:`ConfigurationError`: a lock name short enough for the job's lease name."""
    return _validate(name, what=what, limit=MAX_JOB_NAME_LENGTH)


def validate_namespace(namespace: object) -> str:
    """Return the namespace normalised, or raise :class:`ConfigurationError`."""
    return _validate(namespace, what="namespace", limit=MAX_NAMESPACE_LENGTH)


NAMESPACE_ENV = "FLEETCRON_NAMESPACE"


def resolve_namespace(explicit: str | None) -> str:
    """Namespace: explicit > ``$FLEETCRON_NAMESPACE`` > ``default``."""
    if explicit is not None:
        return validate_namespace(explicit)  # an explicit empty namespace is an error
    return validate_namespace(os.environ.get(NAMESPACE_ENV) or "default")
