"""Validated input models (pydantic), pure: scenarios, and the ThrottlePolicy spec and status
(from which the CRD is generated, ``unthrottle.model.crd``)."""

from unthrottle.model.policy import SpecError, ThrottlePolicySpec, parse_spec
from unthrottle.model.status import ThrottlePolicyStatus

__all__ = [
    "SpecError",
    "ThrottlePolicySpec",
    "ThrottlePolicyStatus",
    "parse_spec",
]
