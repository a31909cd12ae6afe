"""unthrottle's laboratory: what proves the product, shipped apart from it.

- the real-kernel lab: :mod:`.runner` runs scenario workloads in fresh cgroups and measures
  them (:mod:`.sampling`, :mod:`.tune`, :mod:`.agreement`);
- the task simulator: :mod:`.sim` (:mod:`.scenario`, :mod:`.workload`, :mod:`.figures`);
- the development tools: :mod:`.kube` (a real control plane and node), :mod:`.prometheus`;
- the ``unthrottle-lab`` command: :mod:`.cli`.
"""
