"""Per-container increases on a grid of slots, so that a window can slide exactly.

A policy's window (24 h by default, up to 7 d) is read once; later reconciles
read only what is new (:mod:`unthrottle.evidence.incremental`) and fold it in
here. What ages out of the window is dropped exactly, never decayed: the
increases are kept per slot of a fixed grid, and a slot that left the window
is dropped whole.

The grid: slots of ``slot_s`` (``window / 24`` in whole seconds, at least
60 s: 1 h for 24 h, 7 h for 7 d), numbered by an integer from an origin (the
start of the first span folded), which the checkpoint keeps. Per slot and
container: the four counters' increases and the histogram's, per bucket.

- **Folding** a span adds its increases to the grid slots it overlaps, by time
  share: a 5-minute span inside a slot goes to that slot whole; one across a
  boundary is split in proportion to the time on each side (the shares add up
  to the span, so nothing is counted twice or lost; a midpoint rule would move
  up to half a span's worth into the wrong slot instead). A span may not
  start before the last one ended.
- **The window** at ``now`` is every grid slot whose end is after
  ``now − window``: it covers between the window and the window plus one slot
  (exactly the window right after the first read, whose spans are the slots).
- **Settings** (limit, request, the CFS periods the agent reports) are the
  latest seen; the pods are those seen in the window's slots, as a full-window
  read would count them. A container is in the evidence while it was seen (any
  series, settings included) in a slot of the window.

Numbers are float32, in memory as in the checkpoint, so a round trip is
exact: 24 bits of mantissa are a relative error of 6·10⁻⁸ per addition, a
thousand times finer than the ±1 % Prometheus's ``increase`` extrapolation
already has, and they halve the checkpoint. Slots are summed in float64.
Histogram buckets are kept as per-bucket increases (not cumulative), so an
idle container's slot is one non-zero bucket, not 28 equal ones; the evidence
is cumulative again. The agent's backlog series and its active windows ride in
the same columns under negative "bounds" (:func:`columns_of`), which sort before
the histogram's: a difference and a running sum are linear, so any column comes
back exactly, and a checkpoint written before them reads as it did.

The checkpoint (:meth:`WindowAggregates.to_bytes`) is versioned, checked by
CRC-32, zlib-compressed, and sparse: a bit per number says whether it is zero,
and only non-zero numbers are stored, their bytes shuffled (all first bytes,
then all second bytes …) so that exponents compress together. 2,000 containers
× 24 slots with 28 buckets, four in five idle in a slot, and counts that are
not round numbers take 657 KiB (``tests/servers/test_aggregates.py`` measures it:
about 3.3 bytes per non-zero number, pods and names included; format 3's pod, PSI
and burst columns cost a zero bit each where they are absent). A ConfigMap
holds 1 MiB; :meth:`~WindowAggregates.to_chunks` cuts a bigger checkpoint
into pieces.
"""

from __future__ import annotations

import json
import struct
import zlib
from bisect import bisect_left
from typing import Any

import numpy as np
import numpy.typing as npt

from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey

SLOTS_PER_WINDOW = 24
"""Slots a window is divided into: the evidence covers at most 1/24 more than the window."""
MIN_SLOT_S = 60
"""The shortest slot: a span needs a few scrapes for Prometheus's ``increase``."""
MIN_READ_S = 60
""":meth:`WindowAggregates.next_read` asks for nothing shorter (the same reason)."""

_COUNTERS = ("usage_s", "periods", "throttled_periods", "throttled_s", "wait_s",
             "pod_throttled_periods", "pod_throttled_s", "pressure_s",
             "burst_periods", "burst_s", "burst_seen")  # fmt: skip
"""The counter columns. ``wait_s`` (the agent's wait counter) reads as None for a container
the agent does not report (no CFS period gauge): cAdvisor has no such counter.
``pressure_s`` (the kubelet's PSI, cgroup v2) reads as None where it sums to zero: a
container that ran and had a PSI series waited some (a cgroup v1 node has none).
``burst_seen`` is 1 for a span in which the burst counters were exported: a burst never
used (0) is told from counters that are not there (None)."""
_C = len(_COUNTERS)  # columns before the histogram's
_PER_CONTAINER = ("_seen", "_pods", "_limits", "_requests", "_periods", "_changed")
"""The lists with one entry per container (row)."""
_MAGIC = b"UNTHRAGG"
_FORMAT = 3
"""2: the wait column (issue 21); 3: the pod's throttling shared to its containers and the
kubelet's PSI (issue 28). An older checkpoint is refused as any unusable one is: the
operator reads the whole window once, then checkpoints in format 3."""
_HEAD = struct.Struct(">8sHI")  # magic, format, CRC-32 of the compressed body

Matrix = npt.NDArray[np.float32]


_ACTIVE = -0.5
"""The column code of the agent's active windows (the backlog's denominator)."""


def _code(level: int, over: float) -> float:
    """The column code of a backlog series: a negative integer, exact in float64."""
    return -float(1 + level * 1000 + round(over * 100))


def columns_of(item: ContainerEvidence) -> dict[float, float]:
    """The histogram's buckets, and the backlog's series and active windows under codes."""
    if not item.backlog and item.active_windows is None:
        return item.buckets
    out = {_code(level, over): count for (level, over), count in item.backlog.items()}
    if item.active_windows is not None:
        out[_ACTIVE] = item.active_windows
    out.update(item.buckets)
    return out


def _apart(
    columns: dict[float, float],
) -> tuple[dict[float, float], dict[tuple[int, float], float], float | None]:
    """:func:`columns_of` undone: buckets, backlog, active windows."""
    buckets, backlog, active = {}, {}, None
    for code, value in columns.items():
        if code >= 0:
            buckets[code] = value
        elif code == _ACTIVE:
            active = value
        else:
            n = round(-code) - 1
            backlog[(n // 1000, (n % 1000) / 100)] = value
    return buckets, backlog, active


def slot_seconds(window_s: int) -> int:
    """The slot for a window: ``window / 24`` in whole seconds, at least 60 s."""
    return max(MIN_SLOT_S, round(window_s / SLOTS_PER_WINDOW))


class CheckpointError(ValueError):
    """A checkpoint that cannot be read back: corrupt, cut short, foreign, or too new."""


def sealed(magic: bytes, version: int, body: bytes) -> bytes:
    """A checkpoint's envelope: its magic tag, format version and the body's CRC-32."""
    return _HEAD.pack(magic, version, zlib.crc32(body)) + body


def unsealed(data: bytes, magic: bytes, version: int, what: str) -> bytes:
    """The body of :func:`sealed`; :class:`CheckpointError` unless it is whole and ours."""
    if len(data) < _HEAD.size or data[: len(magic)] != magic:
        raise CheckpointError(f"not an unthrottle {what} checkpoint")
    _, found, crc = _HEAD.unpack_from(data)
    if found != version:
        raise CheckpointError(f"checkpoint format {found}; this operator reads {version}")
    body = data[_HEAD.size :]
    if zlib.crc32(body) != crc:
        raise CheckpointError("checkpoint corrupt or cut short (CRC mismatch)")
    return body


class WindowAggregates:
    """Per-container increases over a sliding window, on a grid of slots."""

    def __init__(self, window_s: int, slot_s: int | None = None) -> None:
        slot_s = slot_seconds(window_s) if slot_s is None else slot_s
        if window_s < 1 or slot_s < MIN_SLOT_S:
            raise ValueError(f"a {window_s} s window in {slot_s} s slots (at least 60 s)")
        self.window_s = window_s
        self.slot_s = slot_s
        self._origin_ms: int | None = None
        self._read_ms: int | None = None
        self._version = 0
        self._keys: list[WorkloadKey] = []
        self._rows: dict[WorkloadKey, int] = {}
        self._bounds: list[float] = []
        self._slots: dict[int, Matrix] = {}
        """Grid index → increases, a row per container (maybe fewer rows, or spare ones)."""
        self._present = np.zeros((0, 0), dtype=bool)
        """Which bucket bounds each container's histogram has."""
        self._seen: list[int] = []
        """The last grid slot in which each container was seen."""
        self._pods: list[dict[str, int]] = []
        """Each container's pods, and the last grid slot each was seen in."""
        self._limits: list[int | None] = []
        self._requests: list[int] = []
        self._periods: list[list[int]] = []
        """The CFS periods (µs) the agent last reported for each container, ascending."""
        self._changed: list[int] = []
        """The version at which each container's evidence last changed."""

    @property
    def origin(self) -> float | None:
        """Where grid slot 0 starts (Unix seconds); None before the first fold."""
        return None if self._origin_ms is None else self._origin_ms / 1000

    @property
    def read_until(self) -> float | None:
        """The end of the last span folded (Unix seconds); None before the first."""
        return None if self._read_ms is None else self._read_ms / 1000

    @property
    def version(self) -> int:
        """A token for :meth:`changed_since`: it grows with every change."""
        return self._version

    def next_read(self, now: float) -> tuple[float, float]:
        """What to read next: from :attr:`read_until` to ``now``; the whole window when
        nothing was read yet or the gap is longer than the window; an empty span
        (start = end) when less than :data:`MIN_READ_S` is new."""
        now_ms, window_ms = round(now * 1000), self.window_s * 1000
        if self._read_ms is None or now_ms - self._read_ms > window_ms:
            return (now_ms - window_ms) / 1000, now_ms / 1000
        if now_ms - self._read_ms < MIN_READ_S * 1000:
            return self._read_ms / 1000, self._read_ms / 1000
        return self._read_ms / 1000, now_ms / 1000

    def fold(self, slot: Slot) -> None:
        """Add a span's increases to the grid slots it overlaps, by time share."""
        start, end = round(slot.start * 1000), round(slot.end * 1000)
        if end < start:
            raise ValueError(f"a span that ends ({slot.end}) before it starts ({slot.start})")
        if self._read_ms is not None and start < self._read_ms:
            raise ValueError(
                f"a span from {slot.start} starts before what was folded ends "
                f"({self._read_ms / 1000}): it would be counted twice"
            )
        if end == start:
            return
        if self._origin_ms is None:
            self._origin_ms = start
        self._version += 1
        items = list(slot.evidence.values())
        self._add_bounds(items)
        rows = np.array([self._row(item.key) for item in items], dtype=np.intp)
        increases, present = self._increases(items)
        # a bound new to a container changes its histogram even without increases
        moved = np.count_nonzero(increases, axis=1) + np.count_nonzero(
            present & ~self._present[rows], axis=1
        )
        self._present[rows] |= present
        shares = self._shares(start, end)
        for index, share in shares:
            matrix = self._slot(index)
            matrix[rows] += (increases * share).astype(np.float32)
        last = shares[-1][0]
        for item, row, changed in zip(items, rows.tolist(), moved.tolist(), strict=True):
            if self._note(row, item, last) or changed:
                self._changed[row] = self._version
        self._read_ms = end

    def prune(self, now: float) -> None:
        """Drop the slots that left the window at ``now``, and the pods and containers
        seen only in them."""
        first = self._first(now)
        if first is None:
            return
        version = self._version + 1
        changed = set()
        for index in [i for i in self._slots if i < first]:
            matrix = self._slots.pop(index)
            changed.update(np.flatnonzero(matrix.any(axis=1)).tolist())
        for row, pods in enumerate(self._pods):
            gone = [pod for pod, index in pods.items() if index < first]
            for pod in gone:
                del pods[pod]
            if gone:
                changed.add(row)
        for row in changed:
            if row < len(self._keys):
                self._changed[row] = version
        keep = [row for row, index in enumerate(self._seen) if index >= first]
        if changed or len(keep) < len(self._keys):
            self._version = version
        if len(keep) < len(self._keys):
            self._compact(keep)

    def evidence(self, now: float) -> dict[WorkloadKey, ContainerEvidence]:
        """Every container seen in the window at ``now``, with the sum of its slots there
        (call :meth:`prune` first for :meth:`changed_since` to know of slots dropped)."""
        first = self._first(now)
        if first is None:
            return {}
        n = len(self._keys)
        total = np.zeros((n, _C + len(self._bounds)))
        for index, matrix in self._slots.items():
            if index >= first:
                rows = min(n, matrix.shape[0])
                total[:rows] += matrix[:rows]
        total[:, _C:] = np.cumsum(total[:, _C:], axis=1)
        found = {}
        for row, key in enumerate(self._keys):
            if self._seen[row] < first:
                continue
            values = total[row].tolist()
            buckets, backlog, active = _apart(
                {self._bounds[j]: values[_C + j] for j in np.flatnonzero(self._present[row])}
            )
            found[key] = ContainerEvidence(
                key,
                pods={pod for pod, index in self._pods[row].items() if index >= first},
                usage_s=values[0],
                periods=values[1],
                throttled_periods=values[2],
                throttled_s=values[3],
                wait_s=values[4] if self._periods[row] else None,
                pod_throttled_periods=values[5],
                pod_throttled_s=values[6],
                pressure_s=values[7] or None,
                burst_periods=values[8] if values[10] else None,
                burst_s=values[9] if values[10] else None,
                buckets=buckets,
                backlog=backlog,
                active_windows=active,
                limit_millicores=self._limits[row],
                request_millicores=self._requests[row],
                agent_periods_us=set(self._periods[row]),
            )
        return found

    def changed_since(self, token: int | None) -> set[WorkloadKey]:
        """Containers whose evidence changed after :attr:`version` was ``token`` (all for
        None): new increases, settings or pods, or slots dropped that held some of theirs.
        A container dropped whole is simply no longer in :meth:`evidence`."""
        return {
            key
            for key, changed in zip(self._keys, self._changed, strict=True)
            if token is None or changed > token
        }

    def _first(self, now: float) -> int | None:
        """The first grid slot in the window at ``now`` (None before the first fold)."""
        if self._origin_ms is None:
            return None
        return (round(now * 1000) - self.window_s * 1000 - self._origin_ms) // self._slot_ms

    @property
    def _slot_ms(self) -> int:
        return self.slot_s * 1000

    def _shares(self, start: int, end: int) -> list[tuple[int, float]]:
        """The grid slots a span overlaps, with the share of the span in each."""
        assert self._origin_ms is not None
        origin, slot = self._origin_ms, self._slot_ms
        out = []
        for index in range((start - origin) // slot, (end - 1 - origin) // slot + 1):
            overlap = min(end, origin + (index + 1) * slot) - max(start, origin + index * slot)
            out.append((index, overlap / (end - start)))
        return out

    def _slot(self, index: int) -> Matrix:
        """A grid slot's matrix, with a row for every container known."""
        matrix = self._slots.get(index)
        n = len(self._keys)
        if matrix is None or matrix.shape[0] < n:
            grown = np.zeros((max(n, 2 * (0 if matrix is None else matrix.shape[0])),
                              _C + len(self._bounds)), dtype=np.float32)  # fmt: skip
            if matrix is not None:
                grown[: matrix.shape[0]] = matrix
            self._slots[index] = matrix = grown
        return matrix

    def _row(self, key: WorkloadKey) -> int:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = len(self._keys)
            self._keys.append(key)
            self._seen.append(-(2**62))
            self._pods.append({})
            self._limits.append(None)
            self._requests.append(0)
            self._periods.append([])
            self._changed.append(self._version)
            if self._present.shape[0] <= row:
                grown = np.zeros((max(16, 2 * row), len(self._bounds)), dtype=bool)
                grown[: self._present.shape[0]] = self._present
                self._present = grown
        return row

    def _add_bounds(self, items: list[ContainerEvidence]) -> None:
        """Give every bucket bound these items have a column (kept in order)."""
        known = set(self._bounds)
        for bound in sorted({b for item in items for b in columns_of(item)} - known):
            at = bisect_left(self._bounds, bound)
            self._bounds.insert(at, bound)
            for index, matrix in self._slots.items():
                self._slots[index] = np.insert(matrix, _C + at, 0, axis=1)
            self._present = np.insert(self._present, at, False, axis=1)

    def _increases(
        self, items: list[ContainerEvidence]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """The items' counters and per-bucket (not cumulative) increases, a row each, and
        which bounds each item's histogram has."""
        bounds = self._bounds
        table, present = [], []
        nothing = [False] * len(bounds)
        for item in items:
            row = [item.usage_s, item.periods, item.throttled_periods, item.throttled_s,
                   item.wait_s or 0.0, item.pod_throttled_periods, item.pod_throttled_s,
                   item.pressure_s or 0.0, item.burst_periods or 0.0, item.burst_s or 0.0,
                   float(item.burst_periods is not None)]  # fmt: skip
            buckets = columns_of(item)
            if buckets:
                running = 0.0  # a bound this item lacks repeats the one below: no increase
                for bound in bounds:
                    running = buckets.get(bound, running)
                    row.append(running)
                present.append([bound in buckets for bound in bounds])
            else:
                row += [0.0] * len(bounds)
                present.append(nothing)
            table.append(row)
        out = np.array(table, dtype=np.float64).reshape(len(items), _C + len(bounds))
        if bounds:
            out[:, _C + 1 :] = np.diff(out[:, _C:], axis=1)
        return out, np.array(present, dtype=bool).reshape(len(items), len(bounds))

    def _note(self, row: int, item: ContainerEvidence, last: int) -> bool:
        """Keep the item's pods and settings; True when one of them is new."""
        changed = False  # a container new in this fold was marked by _row
        self._seen[row] = max(self._seen[row], last)
        pods = self._pods[row]
        for pod in item.pods:
            changed = changed or pod not in pods
            pods[pod] = last
        if item.limit_millicores is not None or item.request_millicores:
            settings = (item.limit_millicores, item.request_millicores)
            changed = changed or settings != (self._limits[row], self._requests[row])
            self._limits[row], self._requests[row] = settings
        if item.agent_periods_us:
            periods = sorted(item.agent_periods_us)
            changed = changed or periods != self._periods[row]
            self._periods[row] = periods
        return changed

    def _compact(self, keep: list[int]) -> None:
        """Forget every container but those rows."""
        index, n = np.array(keep, dtype=np.intp), len(self._keys)
        for slot, matrix in self._slots.items():
            self._slots[slot] = self._rows_of(matrix, n)[index]
        self._keys = [self._keys[r] for r in keep]
        self._rows = {key: row for row, key in enumerate(self._keys)}
        for name in _PER_CONTAINER:
            values = getattr(self, name)
            setattr(self, name, [values[r] for r in keep])
        self._present = self._present[index]

    # -- checkpoint ---------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The checkpoint: versioned, CRC-checked, compressed, sparse."""
        n, columns = len(self._keys), _C + len(self._bounds)
        indices = sorted(self._slots)
        matrices = [self._rows_of(self._slots[i], n) for i in indices]
        present = self._present[:n]
        values = [m[m != 0] for m in matrices]
        head = {
            "window_s": self.window_s,
            "slot_s": self.slot_s,
            "origin_ms": self._origin_ms,
            "read_ms": self._read_ms,
            "version": self._version,
            "keys": [[k.namespace, k.deployment, k.container] for k in self._keys],
            "seen": self._seen,
            "pods": self._pods,
            "limits": self._limits,
            "requests": self._requests,
            "periods": self._periods,
            "changed": self._changed,
            "slots": indices,
            "values": [len(v) for v in values],
            "columns": columns,
        }
        text = json.dumps(head, separators=(",", ":")).encode()
        numbers = np.concatenate([np.zeros(0, np.float32), *values]).astype(">f4")
        masks = [np.packbits(m != 0, axis=1) for m in matrices]
        body = b"".join([
            struct.pack(">I", len(text)), text,
            np.array(self._bounds, dtype=">f8").tobytes(),
            np.packbits(present, axis=1).tobytes(),
            *(m.tobytes() for m in masks),
            numbers.view(np.uint8).reshape(-1, 4).T.tobytes(),  # byte planes
        ])  # fmt: skip
        return sealed(_MAGIC, _FORMAT, zlib.compress(body, 9))

    @classmethod
    def from_bytes(cls, data: bytes) -> WindowAggregates:
        """Read a checkpoint back; :class:`CheckpointError` unless it is whole and ours."""
        packed = unsealed(data, _MAGIC, _FORMAT, "aggregates")
        try:
            return cls._decode(zlib.decompress(packed))
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, struct.error, zlib.error) as err:
            raise CheckpointError(f"checkpoint unreadable: {err}") from None

    def to_chunks(self, max_bytes: int) -> list[bytes]:
        """The checkpoint in pieces of at most ``max_bytes`` (for several ConfigMaps)."""
        data = self.to_bytes()
        return [data[i : i + max_bytes] for i in range(0, len(data), max_bytes)]

    @classmethod
    def from_chunks(cls, chunks: list[bytes]) -> WindowAggregates:
        """Read back the pieces of :meth:`to_chunks`, in order."""
        return cls.from_bytes(b"".join(chunks))

    @staticmethod
    def _rows_of(matrix: Matrix, n: int) -> Matrix:
        """Exactly ``n`` rows (spare rows cut, missing ones zero)."""
        if matrix.shape[0] >= n:
            return matrix[:n]
        out = np.zeros((n, matrix.shape[1]), dtype=np.float32)
        out[: matrix.shape[0]] = matrix
        return out

    @classmethod
    def _decode(cls, body: bytes) -> WindowAggregates:
        (length,) = struct.unpack_from(">I", body)
        head: dict[str, Any] = json.loads(body[4 : 4 + length])
        out = cls(int(head["window_s"]), int(head["slot_s"]))
        out._origin_ms, out._read_ms = head["origin_ms"], head["read_ms"]
        out._version = int(head["version"])
        out._keys = [WorkloadKey(str(a), str(b), str(c)) for a, b, c in head["keys"]]
        out._rows = {key: row for row, key in enumerate(out._keys)}
        n, columns = len(out._keys), int(head["columns"])
        head.setdefault("periods", [[] for _ in range(n)])  # written before periods were kept
        for name in ("seen", "pods", "limits", "requests", "periods", "changed"):
            if not isinstance(head[name], list) or len(head[name]) != n:
                raise CheckpointError(f"checkpoint unreadable: {name} for {n} containers")
            setattr(out, f"_{name}", head[name])
        view, at = memoryview(body), 4 + length

        def take(size: int) -> memoryview:
            nonlocal at
            if at + size > len(body):
                raise CheckpointError("checkpoint unreadable: shorter than its header says")
            at += size
            return view[at - size : at]

        out._bounds = np.frombuffer(take(8 * (columns - _C)), dtype=">f8").tolist()
        bits = (columns - _C + 7) // 8
        present = np.frombuffer(take(n * bits), dtype=np.uint8).reshape(n, bits)
        out._present = np.unpackbits(present, axis=1, count=columns - _C).astype(bool)
        bits = (columns + 7) // 8
        masks = [
            np.unpackbits(
                np.frombuffer(take(n * bits), dtype=np.uint8).reshape(n, bits),
                axis=1, count=columns,
            ).astype(bool)
            for _ in head["slots"]
        ]  # fmt: skip
        total = sum(int(v) for v in head["values"])
        planes = np.frombuffer(take(4 * total), dtype=np.uint8).reshape(4, total)
        numbers = planes.T.copy().view(">f4").reshape(total).astype(np.float32)
        counts = [int(m.sum()) for m in masks]
        if at != len(body) or counts != [int(v) for v in head["values"]]:
            raise CheckpointError("checkpoint unreadable: its parts do not add up")
        offset = 0
        for index, mask, count in zip(head["slots"], masks, head["values"], strict=True):
            matrix = np.zeros((n, columns), dtype=np.float32)
            matrix[mask] = numbers[offset : offset + count]
            out._slots[int(index)] = matrix
            offset += count
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WindowAggregates):
            return NotImplemented
        n = len(self._keys)
        same = (
            (self.window_s, self.slot_s, self._origin_ms, self._read_ms, self._version)
            == (other.window_s, other.slot_s, other._origin_ms, other._read_ms, other._version)
            and self._keys == other._keys
            and self._bounds == other._bounds
            and all(getattr(self, name) == getattr(other, name) for name in _PER_CONTAINER)
            and np.array_equal(self._present[:n], other._present[:n])
            and sorted(self._slots) == sorted(other._slots)
        )
        return same and all(
            np.array_equal(self._rows_of(m, n), self._rows_of(other._slots[i], n))
            for i, m in self._slots.items()
        )

    __hash__ = None  # type: ignore[assignment]
