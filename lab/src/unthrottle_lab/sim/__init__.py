"""The task simulator: a task workload on N cores under CFS bandwidth, with ticks, phases,
burst, a pod quota and a sidecar (:mod:`.tasks`); one cgroup's bucket in it (:mod:`.bucket`).
It predicts what the lab measures; the product sizes with the series model
(:mod:`unthrottle.cfs.series`)."""
