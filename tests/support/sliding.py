"""What test_sliding.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import time
from dataclasses import replace

from shop import Workload
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.evidence.sliding import SlidingEvidence
from unthrottle.metrics.source import PrometheusSource
from unthrottle.model.owners import Owners
from unthrottle.recommend import Current, Policy
from unthrottle.scan.advise import advise

HOUR = 3600
END = int(time.time()) // 60 * 60
WINDOW = HOUR
# one Deployment: bursty pods until END − 3 h, then a rollout to calm ones
BURSTY = Workload("ns", "api", 0.1, 0.15, 1.2, 0.5, 2)
CALM = replace(BURSTY, template_hash="5d6e7f", share=0.0, base=0.2)
OWNERS = Owners(replicasets={("ns", BURSTY.replicaset): "api", ("ns", CALM.replicaset): "api"})
KEY = WorkloadKey("ns", "api", "app")
T0 = END - 3 * HOUR + 1800
"""The first read: half of its window bursty, half calm."""


def _read(state: SlidingEvidence, source: PrometheusSource, now: float) -> list[str]:
    reads = state.plan(now)
    for read in reads:
        if read.kind == "head":
            slots = fetch_slots(source, ["ns"], read.start, read.end, slot_s=state.slot_s,
                                owners=OWNERS)  # fmt: skip
        else:
            span = int(read.end - read.start)
            found = fetch(source, ["ns"], span, at=read.start + span, owners=OWNERS)
            slots = [Slot(read.start, read.start + span, found)]
        state.fold(read, slots)
    return [r.kind for r in reads]


def _limit(item: ContainerEvidence | None) -> tuple[int | None, int] | None:
    if item is None or item.kind == "none":
        return None
    rec = advise((item, Current(500, 250), Policy(), WINDOW))
    assert rec is not None
    return rec.limit_millicores, rec.burst_us
