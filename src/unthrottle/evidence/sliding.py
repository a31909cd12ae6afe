"""A window of evidence that slides: the first read costs what ``recommend`` costs, later
reads only what is new, and what ages out is subtracted exactly.

The first reconcile reads the whole window with :func:`~unthrottle.evidence.fetching.fetch`
(the same handful of instant queries as ``unthrottle recommend``). Later ones read

- the **head**, what is new since the last read, folded into
  :class:`~unthrottle.evidence.aggregates.WindowAggregates`' slots (which age out whole);
- while the first read is still in the window, its **tail**: the span that left the
  window since the last tail, read as its own increase and subtracted from the first
  read, once a whole slot of it has left (the head's slots also leave the window a
  slot at a time, so the evidence covers the window and at most one slot more either
  way). Once the window has moved past the first read's end, nothing of it is left
  and it is dropped.

Each is one batch of queries over a few minutes of samples: a 5-minute step on a 24 h
window reads about 0.35 % of the samples per batch; the tail, an hour's worth once an
hour, as much again in one reconcile of twelve. Reading the tail every reconcile
doubled the steady reconcile's queries and its CPU for the first day
(docs/benchmarks.md §9) and made the window no more exact than its slots. The
subtraction is exact up to Prometheus's ``increase`` extrapolation at span edges
(≤ 1 % of a span); a residue is clamped at zero, and it is gone with the first read.
Nothing is decayed by guesswork.

Pure: the caller reads Prometheus (:meth:`SlidingEvidence.plan` says what to read)
and folds the answers in.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Literal

from unthrottle.evidence.aggregates import (
    MIN_READ_S,
    CheckpointError,
    WindowAggregates,
    sealed,
    slot_seconds,
    unsealed,
)
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey

_MAGIC = b"UNTHSLID"
_FORMAT = 1
_FOREVER = 10**9
"""The window of the one-slot stores of the first read and its aged tails: they never
age by themselves."""


@dataclass(frozen=True, slots=True)
class Read:
    """A span to read: ``full`` (the whole window, all over again), ``head`` (new since the
    last read) or ``tail`` (what left the window, to subtract)."""

    kind: Literal["full", "head", "tail"]
    start: float
    end: float


def _combine(a: ContainerEvidence, b: ContainerEvidence, sign: float) -> ContainerEvidence:
    """``a + sign·b``, clamped at zero; settings from ``a`` unless it has none."""
    out = ContainerEvidence(a.key, pods=set(a.pods) | (b.pods if sign > 0 else set()))
    for name in ("usage_s", "periods", "throttled_periods", "throttled_s",
                 "pod_throttled_periods", "pod_throttled_s"):  # fmt: skip
        setattr(out, name, max(0.0, getattr(a, name) + sign * getattr(b, name)))
    if a.wait_s is not None or b.wait_s is not None:  # the agent's counter, where it reports
        out.wait_s = max(0.0, (a.wait_s or 0.0) + sign * (b.wait_s or 0.0))
    for name in ("pressure_s", "burst_periods", "burst_s"):  # where they are exported
        x, y = getattr(a, name), getattr(b, name)
        if x is not None or y is not None:
            setattr(out, name, max(0.0, (x or 0.0) + sign * (y or 0.0)))
    bounds = set(a.buckets) | set(b.buckets)
    out.buckets = {k: max(0.0, a.buckets.get(k, 0.0) + sign * b.buckets.get(k, 0.0))
                   for k in bounds}  # fmt: skip
    keys = set(a.backlog) | set(b.backlog)
    out.backlog = {k: max(0.0, a.backlog.get(k, 0.0) + sign * b.backlog.get(k, 0.0))
                   for k in keys}  # fmt: skip
    if a.active_windows is not None or b.active_windows is not None:
        out.active_windows = max(0.0, (a.active_windows or 0.0)
                                 + sign * (b.active_windows or 0.0))  # fmt: skip
    out.limit_millicores = a.limit_millicores if a.limit_millicores is not None else (
        b.limit_millicores)  # fmt: skip
    out.request_millicores = a.request_millicores or b.request_millicores
    out.agent_periods_us = set(a.agent_periods_us or b.agent_periods_us)
    return out


class SlidingEvidence:
    """The evidence of a window that slides with the clock (see the module's doc)."""

    def __init__(self, window_s: int, slot_s: int | None = None) -> None:
        self.window_s = window_s
        self.slot_s = slot_seconds(window_s) if slot_s is None else slot_s
        self._reset()

    def _reset(self) -> None:
        self.head = WindowAggregates(self.window_s, self.slot_s)
        self.first: WindowAggregates | None = None
        """The first read, one slot: [first_start, first_end]."""
        self.aged: WindowAggregates | None = None
        """The first read's tails that left the window, to subtract."""
        self.first_end: float | None = None
        self.aged_until: float | None = None
        self.read_until: float | None = None
        self._left: tuple[tuple[int, int], dict[WorkloadKey, ContainerEvidence]] | None = None
        """What is left of the first read (its tails subtracted), and the versions of the
        two stores it was computed at: it changes only when a tail is read."""

    def plan(self, now: float) -> list[Read]:
        """What to read at ``now``: the whole window first (or after a gap longer than it),
        then the head and, while the first read is in the window, its tail once a slot
        of it (or the last of it) has left the window."""
        if self.read_until is None or now - self.read_until > self.window_s:
            return [Read("full", now - self.window_s, now)]
        reads = []
        if now - self.read_until >= MIN_READ_S:
            reads.append(Read("head", self.read_until, now))
        if self.first_end is not None and self.aged_until is not None:
            edge = min(now - self.window_s, self.first_end)
            whole = math.floor(edge - self.aged_until)  # an instant read's range: whole seconds
            if whole >= self.slot_s or (edge >= self.first_end and whole >= 1):
                reads.append(Read("tail", self.aged_until, self.aged_until + whole))
        return reads

    def fold(self, read: Read, slots: list[Slot]) -> None:
        """Fold a read's answer in (``full`` and ``tail``: one slot for the whole span)."""
        if read.kind == "full":
            self._reset()
            self.first = WindowAggregates(_FOREVER, max(self.window_s, 60))
            for slot in slots:
                self.first.fold(slot)
            self.aged = WindowAggregates(_FOREVER, max(self.window_s, 60))
            self.first_end, self.aged_until = read.end, read.start
            self.read_until = read.end
        elif read.kind == "head":
            for slot in slots:
                self.head.fold(slot)
            self.read_until = max((s.end for s in slots), default=read.start)
        else:
            assert self.aged is not None
            for slot in slots:
                self.aged.fold(slot)
            self.aged_until = read.end

    def evidence(self, now: float) -> dict[WorkloadKey, ContainerEvidence]:
        """The window's evidence at ``now``."""
        self.head.prune(now)
        if self.first_end is not None and now - self.window_s >= self.first_end:
            self.first = self.aged = None  # the first read has left the window whole
            self.first_end = None
        found = self.head.evidence(now)
        if self.first is None or self.aged is None:
            return found
        for key, left in self._first_left(now).items():
            # a new object either way: the caller may change what it is given
            found[key] = _combine(found[key] if key in found else ContainerEvidence(key),
                                  left, 1.0)  # fmt: skip
        return found

    def _first_left(self, now: float) -> dict[WorkloadKey, ContainerEvidence]:
        """The first read less its tails (its stores never age: ``now`` does not matter)."""
        assert self.first is not None and self.aged is not None
        versions = (self.first.version, self.aged.version)
        if self._left is None or self._left[0] != versions:
            aged = self.aged.evidence(now)
            left = {key: _combine(item, aged[key], -1.0) if key in aged else item
                    for key, item in self.first.evidence(now).items()}  # fmt: skip
            self._left = (versions, left)
        return self._left[1]

    # -- checkpoint ---------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """A versioned, CRC-checked checkpoint of all three stores."""
        head = {"window_s": self.window_s, "slot_s": self.slot_s, "first_end": self.first_end,
                "aged_until": self.aged_until, "read_until": self.read_until}  # fmt: skip
        parts = [json.dumps(head).encode(), self.head.to_bytes(),
                 self.first.to_bytes() if self.first else b"",
                 self.aged.to_bytes() if self.aged else b""]  # fmt: skip
        return sealed(_MAGIC, _FORMAT, b"".join(struct.pack(">I", len(p)) + p for p in parts))

    @classmethod
    def from_bytes(cls, data: bytes) -> SlidingEvidence:
        """Read a checkpoint back; :class:`CheckpointError` unless it is whole and ours."""
        body = unsealed(data, _MAGIC, _FORMAT, "evidence")
        try:
            parts, pos = [], 0
            for _ in range(4):
                (size,) = struct.unpack_from(">I", body, pos)
                parts.append(body[pos + 4 : pos + 4 + size])
                pos += 4 + size
            head = json.loads(parts[0])
            out = cls(int(head["window_s"]), int(head["slot_s"]))
        except (ValueError, KeyError, TypeError, struct.error) as error:
            raise CheckpointError(f"checkpoint unreadable: {error}") from None
        out.head = WindowAggregates.from_bytes(parts[1])
        out.first = WindowAggregates.from_bytes(parts[2]) if parts[2] else None
        out.aged = WindowAggregates.from_bytes(parts[3]) if parts[3] else None
        out.first_end, out.aged_until = head["first_end"], head["aged_until"]
        out.read_until = head["read_until"]
        return out
