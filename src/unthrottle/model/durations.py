"""Durations as a ThrottlePolicy writes them: ``30s``, ``5m``, ``1h30m``, ``24h``, ``7d``, ``1w``.

The Prometheus spelling, in whole seconds: numbers of ASCII digits, each
followed by a unit (``w``, ``d``, ``h``, ``m``, ``s``), largest unit first and
each unit at most once. :data:`DURATION_PATTERN` is the same rule as a regular
expression, for the CRD's schema, so the API server and the operator agree on
what a duration is. Pure, no I/O.
"""

from __future__ import annotations

import re

UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
"""Seconds in each unit, largest first (the order a duration must be written in)."""
MAX_SECONDS = 366 * 86_400
"""Longer than a year is a typo, not a window; refusing it also bounds every number."""
MAX_LENGTH = 32
"""Characters a duration may have (the CRD's ``maxLength``; keeps CEL cost estimates small)."""
DURATION_PATTERN = "^" + "".join(f"([0-9]+{unit})?" for unit in UNIT_SECONDS) + "$"
"""The syntax alone (not the range); it also matches ``""``, which ``minLength: 2`` refuses."""

_DURATION = re.compile(DURATION_PATTERN)
_EXAMPLES = "e.g. 30s, 5m, 1h30m, 24h, 7d"


def parse_duration(text: str) -> int:
    """A duration in whole seconds: ``"1h30m"`` → 5400.

    :class:`ValueError` (quoting the value and giving examples) for an empty
    string, a number without a unit (``"30"``, ``"0"``), a sign, non-ASCII digits
    (``"²d"``), units out of order or repeated, and anything above 366 days.
    ``"0s"`` is a valid duration of zero; fields that need more say so themselves.
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a duration: write it as a string, {_EXAMPLES}")
    found = _DURATION.match(text) if 0 < len(text) <= MAX_LENGTH else None
    if found is None or not any(found.groups()):
        raise ValueError(
            f"{text!r} is not a duration: use whole numbers, each with a unit "
            f"(w, d, h, m, s), largest first, {_EXAMPLES}"
        )
    seconds = sum(
        int(part[:-1]) * UNIT_SECONDS[part[-1]] for part in found.groups() if part is not None
    )
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than 366 days: use a shorter duration, {_EXAMPLES}")
    return seconds


def format_duration(seconds: int) -> str:
    """Seconds as a duration :func:`parse_duration` reads back exactly.

    The rule: hours, minutes and seconds, largest first, omitting zero parts;
    days are used only from 7 days up (``86400`` → ``24h``, ``604800`` → ``7d``,
    ``612000`` → ``7d2h``), weeks never, and zero is ``0s``. A day count reads
    better than ``168h`` for a week or more; below a week, hours are what
    Prometheus users write (``24h``, ``48h``).
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise ValueError(f"{seconds!r} is not a whole, non-negative number of seconds")
    if seconds == 0:
        return "0s"
    parts: list[str] = []
    rest = seconds
    if rest >= 7 * UNIT_SECONDS["d"]:
        parts.append(f"{rest // UNIT_SECONDS['d']}d")
        rest %= UNIT_SECONDS["d"]
    for unit in ("h", "m", "s"):
        count, rest = divmod(rest, UNIT_SECONDS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
