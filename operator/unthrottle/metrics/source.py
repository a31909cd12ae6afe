"""Prometheus (or any PromQL-compatible backend: Thanos, Mimir, Cortex, VictoriaMetrics).

:class:`PrometheusSource` wraps ``prometheus-api-client`` behind the narrow
:class:`MetricsSource` interface. Tests pass a real server; nothing is patched.
Configuration is passed in (:class:`PrometheusConfig`), never read from globals.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.exceptions import InsecureRequestWarning
from urllib3.util.retry import Retry

_TOO_BIG = ("too many samples", "timeout", "deadline exceeded", "limit")
_NARROW = "narrow it with --namespace or a shorter --window"


class MetricsError(RuntimeError):
    """Prometheus could not answer; the message says what to check.

    ``too_big``: the query was refused for its size or timed out, so a smaller one
    (fewer namespaces) may pass.
    """

    def __init__(self, message: str, *, too_big: bool = False) -> None:
        super().__init__(message)
        self.too_big = too_big


class Sample(NamedTuple):
    """One series of an instant vector (a tuple: 10^5 of them are made per large query)."""

    labels: dict[str, str]
    value: float


class RangeSeries(NamedTuple):
    """One series of a range query: its labels, and its points as parallel lists (a tuple
    and two flat lists: 10^5 series of 24 points are made per large query)."""

    labels: dict[str, str]
    times: list[float]
    """Unix times of the evaluations that gave this series a value, ascending."""
    values: list[float]


class MetricsSource(Protocol):
    """What the recommendation side needs of a metrics backend."""

    def instant(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query (at a Unix time, default now)."""
        ...

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """Evaluate a query at ``start``, ``start + step_s``, … up to ``end`` (Unix times,
        millisecond precision)."""
        ...


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """How to reach Prometheus. Every field has a safe default but the URL."""

    url: str
    bearer_token: str | None = None
    bearer_token_file: Path | None = None
    """Read before each query when it changed (projected service-account tokens rotate)."""
    basic_auth: tuple[str, str] | None = None
    ca_bundle: Path | None = None
    insecure: bool = False
    """Skip TLS verification (never in production)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers, e.g. ``X-Scope-OrgID`` for a Mimir / Cortex / Thanos tenant."""
    timeout_s: float = 30.0
    retries: int = 3
    """Retries on connection errors and 429/5xx, with exponential backoff."""
    backoff_s: float = 0.5


class PrometheusSource:
    """A :class:`MetricsSource` over HTTP; counts the queries it sends."""

    def __init__(self, config: PrometheusConfig) -> None:
        self.config = config
        if config.insecure:  # asked for: say it once (the CLI does), not on every query
            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        session = requests.Session()
        session.verify = str(config.ca_bundle) if config.ca_bundle else not config.insecure
        retry = Retry(
            total=config.retries,
            backoff_factor=config.backoff_s,
            status_forcelist=(429, 500, 502, 503, 504),
            allowed_methods=("GET", "POST"),
            raise_on_status=False,
        )
        self.client = PrometheusConnect(
            url=config.url,
            headers=dict(config.headers),
            disable_ssl=config.insecure,
            retry=retry,
            auth=config.basic_auth,
            session=session,
            timeout=config.timeout_s,
        )
        self.queries = 0
        self._lock = threading.Lock()
        self._token: str | None = config.bearer_token
        self._token_stamp: tuple[float, int] | None = None

    def _authorization(self) -> dict[str, str]:
        path = self.config.bearer_token_file
        if path is not None:
            try:
                stat = os.stat(path)
                stamp = (stat.st_mtime, stat.st_size)
                if stamp != self._token_stamp:
                    self._token = path.read_text().strip()
                    self._token_stamp = stamp
            except OSError as err:
                raise MetricsError(f"bearer token file {path}: {err.strerror}") from None
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def instant(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query."""
        params: dict[str, Any] = {} if at is None else {"time": at}
        result = self._send(lambda: self.client.custom_query(promql, params=params))
        # the decoded JSON's label dicts are used as they are: a copy each costs time at 10^5 series
        return [
            Sample(item["metric"], float(item["value"][1])) for item in result if "value" in item
        ]

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """Evaluate a range query (``/api/v1/query_range``)."""
        # the client rounds start and end to whole seconds; its params override them
        exact = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
        result = self._send(
            lambda: self.client.custom_query_range(
                promql,
                datetime.fromtimestamp(start, UTC),
                datetime.fromtimestamp(end, UTC),
                f"{step_s:.3f}",
                params=exact,
            )
        )
        return [
            RangeSeries(item["metric"], [p[0] for p in points], [float(p[1]) for p in points])
            for item in result
            if (points := item.get("values"))
        ]

    def _send(self, query: Callable[[], _T]) -> _T:
        """Send one query (counted), with today's credentials; failures become MetricsError."""
        with self._lock:  # several queries may be in flight (metrics.evidence.fetch)
            # a query sent meanwhile by another thread may read these headers: the same
            # values, or a token newer by one rotation, both valid
            self.client.headers = {**self.config.headers, **self._authorization()}
            self.queries += 1
        try:
            return query()
        except requests.exceptions.SSLError as err:
            raise MetricsError(
                f"TLS to {self.config.url} failed ({err}); check --ca-bundle"
            ) from None
        except requests.exceptions.ConnectionError:
            raise MetricsError(
                f"Prometheus is unreachable at {self.config.url} (connection refused or no route)"
            ) from None
        except requests.exceptions.Timeout:
            raise MetricsError(
                f"Prometheus at {self.config.url} did not answer within "
                f"{self.config.timeout_s:g} s; {_NARROW}",
                too_big=True,
            ) from None
        except PrometheusApiClientException as err:
            text = str(err)
            if "401" in text or "403" in text:
                raise MetricsError(
                    f"Prometheus at {self.config.url} refused the credentials ({text[:120]})"
                ) from None
            found = re.search(r'"error":"((?:[^"\\]|\\.)*)"', text)
            reason = found.group(1) if found else text[:300]
            too_big = any(w in reason for w in _TOO_BIG)
            hint = f"; {_NARROW}" if too_big else ""
            raise MetricsError(
                f"Prometheus refused a query: {reason}{hint}", too_big=too_big
            ) from None
