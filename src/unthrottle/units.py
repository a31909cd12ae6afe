"""CPU bandwidth settings as the kernel sees them: integers in microseconds.

Kubernetes quantities (``"500m"``, ``"1.5"``, ``"2"``) are converted here, at the
edge, and nowhere else. Inside, a limit is integer millicores and a quota,
period or burst is integer microseconds.

Validity follows the kernel (``tg_set_cfs_bandwidth``), which answers EINVAL to:

- a period under 1 ms or over 1 s;
- a quota under 1 ms (``-1`` / ``max`` means unlimited);
- a burst above the quota, or a burst with no quota.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation

MIN_PERIOD_US = 1_000
"""The kernel refuses a period under 1 ms (``min_cfs_quota_period``)."""
MAX_PERIOD_US = 1_000_000
"""The kernel refuses a period over 1 s (``max_cfs_quota_period``)."""
MIN_QUOTA_US = 1_000
"""The kernel refuses a quota under 1 ms (``min_cfs_quota_period`` again)."""
DEFAULT_PERIOD_US = 100_000
"""The kubelet's default ``--cpu-cfs-quota-period``."""


class InvalidSettings(ValueError):
    """A bandwidth setting the kernel would refuse; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """CFS bandwidth of one cgroup: quota and burst per period, all in µs.

    ``quota_us is None`` means no limit (``cpu.max`` = ``max``, v1 quota -1).
    Construction validates; an instance is always something the kernel accepts.
    """

    quota_us: int | None = None
    period_us: int = DEFAULT_PERIOD_US
    burst_us: int = 0

    def __post_init__(self) -> None:
        if not MIN_PERIOD_US <= self.period_us <= MAX_PERIOD_US:
            raise InvalidSettings(
                "period", f"{self.period_us} µs is outside the kernel's range 1 ms – 1 s"
            )
        if self.quota_us is not None and self.quota_us < MIN_QUOTA_US:
            raise InvalidSettings(
                "quota", f"{self.quota_us} µs is under the kernel's minimum of 1 ms"
            )
        if self.burst_us < 0:
            raise InvalidSettings("burst", f"{self.burst_us} µs is negative")
        if self.burst_us and self.quota_us is None:
            raise InvalidSettings("burst", "a burst needs a quota (there is no limit)")
        if self.quota_us is not None and self.burst_us > self.quota_us:
            raise InvalidSettings(
                "burst", f"{self.burst_us} µs is above the quota of {self.quota_us} µs"
            )

    @property
    def limited(self) -> bool:
        """True when a quota is set."""
        return self.quota_us is not None

    @property
    def millicores(self) -> int | None:
        """The limit as Kubernetes millicores (quota / period), rounded up."""
        if self.quota_us is None:
            return None
        return -(-self.quota_us * 1000 // self.period_us)

    @classmethod
    def from_millicores(
        cls, millicores: int | None, *, period_us: int = DEFAULT_PERIOD_US, burst_us: int = 0
    ) -> Bandwidth:
        """The quota the kubelet writes for a limit: ``millicores × period / 1000``.

        Like the kubelet (``MilliCPUToQuota``), a quota under 1 ms is raised to 1 ms.
        """
        if millicores is None:
            return cls(None, period_us, burst_us)
        if millicores <= 0:
            raise InvalidSettings("limit", f"{millicores}m is not a positive CPU limit")
        quota = max(MIN_QUOTA_US, millicores * period_us // 1000)
        return cls(quota, period_us, burst_us)


_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(m?)\s*$")


def parse_cpu(quantity: str | int | float) -> int:
    """A Kubernetes CPU quantity as integer millicores, rounded up like the API server.

    ``"500m"`` → 500, ``"1.5"`` → 1500, ``2`` → 2000, ``"0.0001"`` → 1.
    """
    if isinstance(quantity, bool):
        raise ValueError(f"not a CPU quantity: {quantity!r}")
    text = str(quantity)
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"not a CPU quantity: {quantity!r} (expected e.g. '500m', '1.5', '2')")
    number, milli = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"not a CPU quantity: {quantity!r}") from err
    millicores = value if milli else value * 1000
    return int(millicores.to_integral_value(rounding=ROUND_CEILING))


def quota_of(millicores: int, period_us: int) -> int:
    """The quota a limit gives at a period, µs (a limit of 500m at 100 ms: 50,000 µs)."""
    return millicores * period_us // 1000


def format_cpu(millicores: int) -> str:
    """Millicores as the shortest Kubernetes quantity: 2000 → ``"2"``, 1500 → ``"1500m"``."""
    if millicores < 0:
        raise ValueError(f"negative CPU amount: {millicores}m")
    if millicores % 1000 == 0:
        return str(millicores // 1000)
    return f"{millicores}m"
