"""Validated input models (pydantic), pure: scenarios, and the ThrottlePolicy spec and status
(from which the CRD is generated, ``unthrottle.model.crd``)."""

from unthrottle.model.policy import SpecError, ThrottlePolicySpec, parse_spec
from unthrottle.model.scenario import RunSpec, Scenario, ScenarioError, WorkloadSpec, load_scenario
from unthrottle.model.status import ThrottlePolicyStatus

__all__ = [
    "RunSpec",
    "Scenario",
    "ScenarioError",
    "SpecError",
    "ThrottlePolicySpec",
    "ThrottlePolicyStatus",
    "WorkloadSpec",
    "load_scenario",
    "parse_spec",
]
