"""The one exception type of the workload package."""

from __future__ import annotations


class WorkloadError(ValueError):
    """Bad workload input or config.

    A ``ValueError`` so the CLI's top level turns it into a message and exit status 2. Messages name
    the file, the record (index or line) and the field, so a user can find the offending entry.
    """


def where(path: object, record: object | None = None, field: str | None = None) -> str:
    """``file: record 3: field 'output'`` prefix for error messages."""
    parts = [str(path)]
    if record is not None:
        parts.append(str(record))
    if field is not None:
        parts.append(f"field '{field}'")
    return ": ".join(parts)
