"""Validated input models (pydantic), pure: scenarios now, ThrottlePolicy later."""

from unthrottle.model.scenario import RunSpec, Scenario, ScenarioError, WorkloadSpec, load_scenario

__all__ = ["RunSpec", "Scenario", "ScenarioError", "WorkloadSpec", "load_scenario"]
