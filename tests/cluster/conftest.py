"""The real control plane (etcd, kube-apiserver, controllers, kwok) and the real node
(containerd, runc, kubelet): the operator, apply, the chart, the reports.

The fixtures this area's modules share are registered here (defined in tests/support);
the session-wide ones (``layout``, ``control_plane``, ``real_node``, ``kube``) and the
markers' skip rules are in tests/conftest.py."""

from __future__ import annotations

from support.admission import (  # noqa: F401 (fixtures)
    tls,
)
from support.real_cluster import (  # noqa: F401 (fixtures)
    apis,
    cluster,
    crd_installed,
)
from support.recommend_cli import (  # noqa: F401 (fixtures)
    cluster_shop,
    prometheus,
)
from support.report_html import (  # noqa: F401 (fixtures)
    browser,
)
from support.scan import (  # noqa: F401 (fixtures)
    shop,
)
from support.thanos import (  # noqa: F401 (fixtures)
    thanos_binary,
)
