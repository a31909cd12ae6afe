"""CPU burst requested by pod annotations: parsing and resolution, pure.

``unthrottle.io/cpu-burst`` (ours):

=====================  =====================================================
value                  meaning
=====================  =====================================================
``40ms``               every container: a 40 ms burst (``us``, ``ms``, ``s``)
``50%``                every container: half of its own quota
``api=40ms,envoy=5%``  per container
``*=10ms,api=40ms``    a default for the others, and an override
``0`` / ``api=0``      no burst
=====================  =====================================================

``koordinator.sh/cpuBurst`` (Koordinator's JSON), for pods that already carry
it: ``{"policy": "auto" | "cpuBurstOnly", "cpuBurstPercent": 1000}`` gives every
container ``cpuBurstPercent`` % of its quota (Koordinator's default: 1000).
``"none"`` gives none, and ``"cfsQuotaBurstOnly"`` scales the quota, which this
agent does not do, so it gives no burst either. Our annotation wins when both
are there.

The kernel refuses a burst above the quota, so a resolved burst is clamped to
the quota, and the caller is told.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

BURST_ANNOTATION = "unthrottle.io/cpu-burst"
KOORDINATOR_ANNOTATION = "koordinator.sh/cpuBurst"
KOORDINATOR_DEFAULT_PERCENT = 1000.0

_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|%)?\s*$")
_UNIT_US = {"us": 1, "ms": 1000, "s": 1_000_000}


class BurstAnnotationError(ValueError):
    """A burst annotation that cannot be read; the message names the annotation and the part."""


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """A burst for one container: microseconds, or a share of its quota."""

    burst_us: int | None = None
    percent: float | None = None

    def resolve(self, quota_us: int | None) -> tuple[int, bool]:
        """The burst in µs for a container with this quota, and whether it was clamped to it."""
        if quota_us is None:
            return 0, False  # no limit: nothing to burst above
        wanted = (
            self.burst_us
            if self.burst_us is not None
            else math.floor(quota_us * (self.percent or 0.0) / 100)
        )
        return (quota_us, True) if wanted > quota_us else (wanted, False)


NONE = BurstSpec(burst_us=0)


def _amount(text: str, where: str) -> BurstSpec:
    match = _AMOUNT.match(text)
    if not match:
        raise BurstAnnotationError(
            f"{BURST_ANNOTATION}: {where}{text!r} is not a duration (40ms) or a percentage (50%)"
        )
    number, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        return BurstSpec(percent=number)
    if unit is None and number != 0:
        raise BurstAnnotationError(
            f"{BURST_ANNOTATION}: {where}{text!r} needs a unit (us, ms, s or %)"
        )
    return BurstSpec(burst_us=round(number * _UNIT_US.get(unit or "us", 1)))


def _ours(value: str) -> dict[str, BurstSpec]:
    specs: dict[str, BurstSpec] = {}
    if "=" not in value:
        return {"*": _amount(value, "")}
    for item in value.split(","):
        name, sep, amount = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BurstAnnotationError(
                f"{BURST_ANNOTATION}: {item.strip()!r} is not CONTAINER=AMOUNT"
            )
        if name in specs:
            raise BurstAnnotationError(f"{BURST_ANNOTATION}: container {name!r} appears twice")
        specs[name] = _amount(amount, f"{name}: ")
    return specs


def _koordinator(value: str) -> dict[str, BurstSpec]:
    try:
        config = json.loads(value)
    except json.JSONDecodeError as err:
        raise BurstAnnotationError(f"{KOORDINATOR_ANNOTATION}: not JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise BurstAnnotationError(f"{KOORDINATOR_ANNOTATION}: not a JSON object")
    policy = config.get("policy", "auto")
    if policy not in {"auto", "cpuBurstOnly", "cfsQuotaBurstOnly", "none"}:
        raise BurstAnnotationError(f"{KOORDINATOR_ANNOTATION}: unknown policy {policy!r}")
    if policy in {"none", "cfsQuotaBurstOnly"}:
        return {"*": NONE}
    percent = config.get("cpuBurstPercent", KOORDINATOR_DEFAULT_PERCENT)
    if not isinstance(percent, int | float) or isinstance(percent, bool) or percent < 0:
        raise BurstAnnotationError(
            f"{KOORDINATOR_ANNOTATION}: cpuBurstPercent {percent!r} is not a number ≥ 0"
        )
    return {"*": BurstSpec(percent=float(percent))}


def burst_specs(annotations: dict[str, str]) -> dict[str, BurstSpec]:
    """Container name (or ``*`` for the rest) → burst; empty when the pod asks for none."""
    if BURST_ANNOTATION in annotations:
        return _ours(annotations[BURST_ANNOTATION])
    if KOORDINATOR_ANNOTATION in annotations:
        return _koordinator(annotations[KOORDINATOR_ANNOTATION])
    return {}


def spec_for(specs: dict[str, BurstSpec], container: str) -> BurstSpec | None:
    """The burst a container asks for; None when the annotation does not cover it."""
    return specs.get(container, specs.get("*"))
