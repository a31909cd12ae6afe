"""The recommendation engine: pure estimators over plain data, no I/O.

Public surface: :func:`recommend` and its inputs and output.
"""

from unthrottle.model.runtime import Runtime
from unthrottle.recommend.engine import recommend
from unthrottle.recommend.types import (
    CounterEvidence,
    Current,
    Evidence,
    PeriodEvidence,
    Policy,
    PolicyError,
    Recommendation,
    Strategy,
    Waits,
)

__all__ = [
    "CounterEvidence",
    "Current",
    "Evidence",
    "PeriodEvidence",
    "Policy",
    "PolicyError",
    "Recommendation",
    "Runtime",
    "Strategy",
    "Waits",
    "recommend",
]
