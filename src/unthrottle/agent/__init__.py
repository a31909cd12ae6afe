"""The node agent: discover container cgroups, sample them every period, export to Prometheus.

Parts: :mod:`.discovery` (which cgroups are containers, and their names),
:mod:`.sampling` (per-window
demand), :mod:`.exposition` (the /metrics text), :mod:`.server` (HTTP).
"""
