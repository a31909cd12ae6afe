"""Kernel tests: root and real cgroups (the agent, the lab, the CFS settings), no control
plane."""
