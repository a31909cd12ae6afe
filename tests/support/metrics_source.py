"""What test_metrics_source.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

from unthrottle.metrics.promql import string

HOSTILE = [
    'shop"} or vector(1) #',
    "a|b",
    "back\\slash",
    ".*",
    "new\nline",
]


def history(now: int) -> str:
    """An hour of cAdvisor periods for a sane namespace and for each hostile one."""
    lines = []
    names = ["shop", *HOSTILE]
    for index, ns in enumerate(names):
        labels = f'namespace={string(ns)},pod="p{index}",container="c"'
        for step in range(0, 3600, 15):
            lines.append(f"container_cpu_cfs_periods_total{{{labels}}} {step // 15 * 150} "
                         f"{now - 3600 + step}")  # fmt: skip
        lines.append(f'container_cpu_cfs_periods_total{{namespace={string(ns)},pod="p{index}",'
                     f'container="POD"}} 1 {now - 60}')  # fmt: skip
    return "\n".join(lines) + "\n"


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []
    paths: ClassVar[list[str]] = []
    """Each request's path with its query string."""
    status: ClassVar[int] = 200

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        type(self).paths.append(self.path)
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"job": "x"}, "value": [1, "1"]}]}}).encode()  # fmt: skip
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body if type(self).status == 200 else b"denied")

    def log_message(self, format: str, *args: object) -> None:
        pass
