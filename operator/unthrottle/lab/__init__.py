"""The real-kernel lab: run scenario workloads in fresh cgroups and measure them."""

from unthrottle.lab.runner import LabOptions, run_run, run_sampled, run_scenario

__all__ = ["LabOptions", "run_run", "run_sampled", "run_scenario"]
