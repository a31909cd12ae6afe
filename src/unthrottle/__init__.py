"""unthrottle: find CFS throttling, prove it, and fix it with the smallest CPU limit.

The package is split by role (see docs/architecture.md):

- pure parts, no I/O: :mod:`unthrottle.cfs` (the CFS bandwidth model) and
  :mod:`unthrottle.model` (validated input models);
- I/O parts at the edges: :mod:`unthrottle.cgroups` (cgroup files),
  :mod:`unthrottle_lab` (real-kernel workload runs);
- wiring: :mod:`unthrottle.cli`.
"""

__version__ = "0.1.0"
