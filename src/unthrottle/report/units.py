"""How a report writes its figures: quantities as Kubernetes writes them, ratios as
percentages, bursts in milliseconds. Every renderer uses these, so the formats agree."""

from __future__ import annotations

import time

from unthrottle.units import format_cpu

DASH = "–"
"""A figure that is not there (no recommendation, no evidence)."""


def cpu(millicores: int | None) -> str:
    """``1400m``, ``2``; ``none`` for no limit."""
    return "none" if millicores is None else format_cpu(millicores)


def limit(millicores: int | None, lower: int | None = None) -> str:
    """A recommended limit: ``1640m``, or ``1640m (580m–1640m)`` when it is the top of a
    range (made from throttled data: what the demand itself asks for lies in it)."""
    if lower is None or millicores is None or lower >= millicores:
        return cpu(millicores)
    return f"{cpu(millicores)} ({cpu(lower)}–{cpu(millicores)})"


def signed_cpu(millicores: int) -> str:
    """A difference: ``+900m``, ``-300m``, ``0``."""
    if millicores == 0:
        return "0"
    return ("+" if millicores > 0 else "-") + format_cpu(abs(millicores))


def pct(ratio: float | None) -> str:
    """``10.0 %``; a dash for no figure."""
    return DASH if ratio is None else f"{ratio * 100:.1f} %"


def expected(ratio: float | None, span: tuple[float, float] | None = None) -> str:
    """An expected throttle ratio: ``2.0 %``, or ``99.7 % (0.0–99.7 %)`` on a shared node,
    where it is the top of a range (beside the same neighbours – if the node goes quiet)."""
    if span is None or ratio is None or span[0] >= span[1]:
        return pct(ratio)
    return f"{pct(ratio)} ({span[0] * 100:.1f}–{pct(span[1])})"


def burst(us: int) -> str:
    """``20 ms``, ``0.5 ms``, ``0``."""
    return "0" if us == 0 else f"{us / 1000:g} ms"


def count(value: int | None) -> str:
    """A GOMAXPROCS or processor count; a dash when unset."""
    return DASH if value is None else str(value)


def change(old: str, new: str) -> str:
    """``500m → 1400m``, or the value alone when it stays."""
    return old if old == new else f"{old} → {new}"


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 container``, ``3 containers``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def duration(seconds: float) -> str:
    """``5 m``, ``2 h``, ``1 d``, ``90 s``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    if seconds >= 3_600:
        return f"{seconds / 3_600:.1f} h"
    return f"{int(seconds // 60)} m" if seconds >= 60 else f"{int(seconds)} s"


def when(unix_s: float) -> str:
    """``2026-01-05 14:03 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix_s))
