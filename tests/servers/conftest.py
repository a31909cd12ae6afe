"""A real Prometheus, VictoriaMetrics, a browser or a TLS server on loopback, without the node
or the control plane.

The fixtures this area's modules share are registered here (defined in tests/support);
the session-wide ones (``layout``, ``control_plane``, ``real_node``, ``kube``) and the
markers' skip rules are in tests/conftest.py."""

from __future__ import annotations

from support.metrics_tls_auth import (  # noqa: F401 (fixtures)
    https,
)
