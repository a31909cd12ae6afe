"""Prometheus (or any PromQL-compatible backend: Thanos, Mimir, Cortex, VictoriaMetrics).

:class:`PrometheusSource` speaks the HTTP API (``/api/v1/query``, ``/api/v1/query_range``)
over one ``requests`` session, behind the narrow :class:`MetricsSource` interface. It is
the one place that talks to Prometheus, so it is where a failure is told apart: a
refused connection from a read timeout, TLS against plain HTTP, a URL that is not a
Prometheus API, and Prometheus's own error text, whole. Tests pass a real server;
nothing is patched.

Configuration is passed in (:class:`PrometheusConfig`), never read from globals, and
checked when built: a setting that cannot work raises :class:`PrometheusConfigError`
naming the field, so a front-end can name its own option. No secret (token, password,
header value) is ever part of a message or a ``repr``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, Self
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.auth import HTTPBasicAuth
from urllib3.exceptions import (
    ConnectTimeoutError,
    InsecureRequestWarning,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ProxyError,
    ReadTimeoutError,
)
from urllib3.exceptions import SSLError as Urllib3SSLError
from urllib3.util.retry import Retry

# VictoriaMetrics names the flag a refusal hit: -search.maxSamplesPerQuery, …
_TOO_BIG = ("too many samples", "timeout", "deadline exceeded", "limit", "-search.max")
_VM_ECHO = re.compile(r'^error when executing query=".*?" (?:for|on the time range) \([^)]*\): ')
"""The query VictoriaMetrics repeats before its reason (``…_limits{…}`` is not a limit hit)."""
_EVALUATE_AS_ASKED = {"nocache": "1"}
"""Sent with every query. VictoriaMetrics would otherwise evaluate an instant query asked
for within ``-search.latencyOffset`` (30 s) of its clock 30 s earlier, and align a range
query of 50 points or more to multiples of its step (docs/metrics.md, "Compatible
backends"); Prometheus, Thanos and Mimir ignore it."""
_WHOLE_ANSWERS_ONLY = {"partial_response": "false"}
"""Sent with every query. Thanos Query answers by default with what the stores it reached
hold, the others' loss only a ``warnings`` entry beside the data: a recommendation made
from half a Deployment's pods would size it for half its demand. With this, a store that
fails the query fails it (docs/thanos.md); Prometheus, Mimir and VictoriaMetrics ignore it."""
_NARROW = "narrow it with --namespace or a shorter --window"
_BASE_URL = "give the server's base URL, e.g. http://prometheus:9090 or https://host/prometheus"
MAX_TIMEOUT_S = 3600.0
"""A query that needs longer than an hour is a query to narrow, not to wait for."""
MAX_RETRIES = 10
"""With the backoff doubling from 0.5 s, ten retries already wait over eight minutes."""


class MetricsError(RuntimeError):
    """Prometheus could not answer; the message says what to check.

    ``too_big``: the query was refused for its size or timed out, so a smaller one
    (fewer namespaces) may pass.
    """

    def __init__(self, message: str, *, too_big: bool = False) -> None:
        super().__init__(message)
        self.too_big = too_big


class PrometheusConfigError(ValueError):
    """A :class:`PrometheusConfig` that cannot work; ``field`` is the field at fault and
    ``reason`` says why without quoting a secret."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


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


# -- what a setting may hold ---------------------------------------------------------------

_NETLOC = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*))(?::(?P<port>[^:]*))?$")
_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _host_problem(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return f"its host {host!r} is not a valid host name"
    labels = ascii_host.rstrip(".").split(".")
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in labels):
        return f"its host {host!r} is not a valid host name"
    return None


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a Prometheus base URL, or None. The reason quotes the URL only
    when it holds no credentials."""
    if not url:
        return f"is empty: {_BASE_URL}"
    authority = re.split(r"[/?#]", url.partition("://")[2] or url, maxsplit=1)[0]
    if "@" in authority:
        return ("holds credentials (USER:PASSWORD@): pass them with --basic-auth or "
                "--bearer-token, never in the URL")  # fmt: skip
    if _CONTROL.search(url) or any(c.isspace() for c in url):
        return f"{url!r} holds a space or a control character"
    try:
        parts = urlsplit(url)
    except ValueError:  # "http://[::1": an unclosed IPv6 bracket
        return f"{url!r} is not a URL (an IPv6 host is written in brackets: http://[::1]:9090)"
    if parts.scheme.lower() not in {"http", "https"}:
        return f"{url!r} does not start with http:// or https:// ({_BASE_URL})"
    netloc = _NETLOC.match(parts.netloc)
    if netloc is None:
        return f"{url!r} is not a URL (an IPv6 host is written in brackets: http://[::1]:9090)"
    port = netloc["port"]
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return f"{url!r}: the port must be a number from 1 to 65535"
    if netloc["v6"] is not None:
        try:
            ipaddress.IPv6Address(netloc["v6"])
        except ValueError:
            return f"{url!r}: {netloc['v6']!r} is not an IPv6 address"
    elif not netloc["host"]:
        return f"{url!r} has no host ({_BASE_URL})"
    elif (problem := _host_problem(netloc["host"])) is not None:
        return f"{url!r}: {problem}"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return f"{url!r} has a query or a fragment: {_BASE_URL}"
    if re.search(r"/api/v1(/.*)?$", parts.path):
        return f"{url!r} includes the API path /api/v1: {_BASE_URL} (the API path is added)"
    return None


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as a bearer token, or None. Never quotes it."""
    if not token:
        return "is empty"
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):
        where = "a control character" if _CONTROL.search(token) else "a space or non-ASCII"
        return f"holds {where}: a token is one line of printable ASCII"
    return None


def header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be sent as a header, or None. Quotes the name only."""
    if not _HEADER_NAME.match(name):
        return f"{name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
    if _CONTROL.sub("", value.replace("\t", " ")) != value.replace("\t", " "):
        return f"the value of {name} holds a control character (a newline?)"
    if value != value.strip():
        return f"the value of {name} starts or ends with a space"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return f"the value of {name} holds a character HTTP headers cannot carry (not Latin-1)"
    return None


_SECRET_HEADER = re.compile(r"auth|token|key|secret|pass|cookie|session|credential", re.I)


def is_secret_header(name: str) -> bool:
    """Whether a header's value is a credential (``Authorization``, ``X-API-Key`` …) rather
    than a setting such as ``X-Scope-OrgID``, by its name."""
    return bool(_SECRET_HEADER.search(name))


def strip_token(text: str) -> str:
    """A token as read from a file or the environment: surrounding whitespace (a trailing
    newline) removed, as kubectl does with token files."""
    return text.strip()


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """How to reach Prometheus. Every field has a safe default but the URL; a field that
    cannot work raises :class:`PrometheusConfigError` naming it."""

    url: str
    """The server's base URL (``http://prometheus:9090``, ``https://host/prometheus``);
    a trailing ``/`` is dropped."""
    bearer_token: str | None = field(default=None, repr=False)
    bearer_token_file: Path | None = None
    """Read before each query when it changed (projected service-account tokens rotate)."""
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    ca_bundle: Path | None = None
    insecure: bool = False
    """Skip TLS verification (never in production)."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra headers, e.g. ``X-Scope-OrgID`` for a Mimir / Cortex / Thanos tenant (values
    may be credentials: never shown)."""
    timeout_s: float = 30.0
    """Seconds to connect, and to wait for each answer; at most :data:`MAX_TIMEOUT_S`."""
    retries: int = 3
    """Retries on refused or reset connections and 429/5xx, with exponential backoff; a
    timeout is not retried (it took the whole timeout once, and would again)."""
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        problem = url_problem(self.url) if isinstance(self.url, str) else "is not a string"
        if problem is not None:
            raise PrometheusConfigError("url", problem)
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.bearer_token is not None and (problem := token_problem(self.bearer_token)):
            raise PrometheusConfigError("bearer_token", problem)
        if self.basic_auth is not None:
            user, password = self.basic_auth
            if not user or ":" in user:
                raise PrometheusConfigError("basic_auth", "expected USER:PASSWORD")
            if _CONTROL.search(user + password):
                raise PrometheusConfigError("basic_auth", "holds a control character (a newline?)")
        for name, value in self.headers.items():
            if (problem := header_problem(name, value)) is not None:
                raise PrometheusConfigError("headers", problem)
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:  # also refuses NaN
            raise PrometheusConfigError(
                "timeout_s", f"{self.timeout_s!r} is not a number of seconds in (0, 3600]"
            )
        if isinstance(self.retries, bool) or not 0 <= self.retries <= MAX_RETRIES:
            raise PrometheusConfigError(
                "retries", f"{self.retries!r} is not from 0 to {MAX_RETRIES}"
            )
        if not 0 <= self.backoff_s <= 60:
            raise PrometheusConfigError("backoff_s", f"{self.backoff_s!r} is not in [0, 60]")

    def secrets(self) -> tuple[str, ...]:
        """Every credential this config carries, to keep out of any text shown."""
        found = [self.bearer_token or ""]
        found += [value for name, value in self.headers.items() if is_secret_header(name)]
        if self.basic_auth is not None:
            found += [self.basic_auth[1], ":".join(self.basic_auth)]
        return tuple(s for s in found if len(s) >= 4)


# -- sending -------------------------------------------------------------------------------


class _Retry(Retry):
    """urllib3's retries, except after a timeout or a TLS failure: the server took the
    whole timeout once, and the same query would only time out again (a scan narrows it
    instead); a certificate does not become trusted by asking again."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> Self:
        timed_out = isinstance(error, ReadTimeoutError | ConnectTimeoutError)
        if (timed_out and not isinstance(error, NewConnectionError)) or isinstance(
            error, Urllib3SSLError
        ):
            raise MaxRetryError(_pool, url or "", error) from error
        return super().increment(method, url, response, error, _pool, _stacktrace)


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class PrometheusSource:
    """A :class:`MetricsSource` over HTTP; counts the queries it sends."""

    def __init__(self, config: PrometheusConfig) -> None:
        self.config = config
        if config.insecure:  # asked for: say it once (the CLI does), not on every query
            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        session = requests.Session()
        session.verify = str(config.ca_bundle) if config.ca_bundle else not config.insecure
        if config.basic_auth is not None:  # UTF-8, as RFC 7617 and Prometheus read it
            user, password = config.basic_auth
            session.auth = HTTPBasicAuth(user.encode(), password.encode())
        retry = _Retry(
            total=config.retries,
            backoff_factor=config.backoff_s,
            status_forcelist=(429, 500, 502, 503, 504),
            allowed_methods=("GET",),
            raise_on_status=False,
            respect_retry_after_header=False,  # "Retry-After: 3600" must not hang a scan
        )
        adapter = HTTPAdapter(max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._session = session
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
                    token = strip_token(path.read_text(errors="replace"))
                    if (problem := token_problem(token)) is not None:
                        raise MetricsError(f"bearer token file {path}: {problem}")
                    self._token, self._token_stamp = token, stamp
            except OSError as err:
                raise MetricsError(f"bearer token file {path}: {err.strerror}") from None
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def instant(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query."""
        params: dict[str, Any] = {"query": promql, **_EVALUATE_AS_ASKED, **_WHOLE_ANSWERS_ONLY}
        if at is not None:
            params["time"] = at
        result = self._get("/api/v1/query", params)
        # the decoded JSON's label dicts are used as they are: a copy each costs time at 10^5 series
        try:
            return [
                Sample(item["metric"], float(item["value"][1]))
                for item in result
                if "value" in item
            ]
        except (KeyError, IndexError, TypeError, ValueError):
            raise self._not_prometheus("/api/v1/query", "an answer of another shape") from None

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """Evaluate a range query (``/api/v1/query_range``)."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{step_s:.3f}", **_EVALUATE_AS_ASKED,
                  **_WHOLE_ANSWERS_ONLY}  # fmt: skip
        result = self._get("/api/v1/query_range", params)
        try:
            return [
                RangeSeries(item["metric"], [p[0] for p in points], [float(p[1]) for p in points])
                if len(points) > 1
                # one point (a read of one step, what a steady reconcile sends): no
                # comprehensions to build, a third of the time at 32,000 series
                else RangeSeries(item["metric"], [points[0][0]], [float(points[0][1])])
                for item in result
                if (points := item.get("values"))
            ]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise self._not_prometheus(
                "/api/v1/query_range", "an answer of another shape"
            ) from None

    def _get(self, path: str, params: dict[str, Any]) -> list[Any]:
        """Send one query (counted), with today's credentials; failures become MetricsError."""
        with self._lock:  # several queries may be in flight (metrics.evidence.fetch)
            headers = {**self.config.headers, **self._authorization()}
            self.queries += 1
        began = time.monotonic()
        try:
            # verify is passed on: left out, REQUESTS_CA_BUNDLE would override --ca-bundle
            response = self._session.get(self.config.url + path, params=params, headers=headers,
                                         timeout=self.config.timeout_s,
                                         verify=self._session.verify)  # fmt: skip
        except requests.RequestException as err:
            raise self._unreachable(err, time.monotonic() - began) from None
        return self._result(response, path)

    # -- what went wrong, for people ---------------------------------------------------------

    def _unreachable(self, err: requests.RequestException, took_s: float) -> MetricsError:
        """No HTTP answer: say which way it failed, and after how long."""
        url, timeout = self.config.url, self.config.timeout_s
        reason: BaseException = err
        if err.args and isinstance(err.args[0], MaxRetryError) and err.args[0].reason:
            reason = err.args[0].reason
        after = f"after {took_s:.1f} s" + (f", {self.config.retries} retries" if
                                            self.config.retries else "")  # fmt: skip
        if isinstance(reason, ReadTimeoutError) or isinstance(err, requests.ReadTimeout):
            return MetricsError(
                f"Prometheus at {url} did not answer within {timeout:g} s (read timeout: it "
                f"accepted the connection, then sent nothing); {_NARROW}, or raise --timeout",
                too_big=True,
            )
        if isinstance(reason, Urllib3SSLError) or isinstance(err, requests.exceptions.SSLError):
            return MetricsError(self._tls_problem(str(reason)))
        if isinstance(reason, NameResolutionError):
            host = urlsplit(url).hostname
            return MetricsError(f"Prometheus is unreachable at {url}: the host {host!r} "
                                f"is not known (DNS, {after})")  # fmt: skip
        if isinstance(reason, ProxyError):
            return MetricsError(f"Prometheus is unreachable at {url} through the proxy "
                                f"(HTTP(S)_PROXY in the environment, {after})")  # fmt: skip
        if isinstance(reason, NewConnectionError):
            cause = reason.__cause__ or reason.__context__
            if isinstance(cause, ConnectionRefusedError) or "refused" in str(reason):
                return MetricsError(f"Prometheus is unreachable at {url}: connection refused "
                                    f"(nothing listens there; {after})")  # fmt: skip
            strerror = getattr(cause, "strerror", None) or "no route"
            return MetricsError(f"Prometheus is unreachable at {url}: {strerror} ({after})")
        if isinstance(reason, ConnectTimeoutError) or isinstance(err, requests.ConnectTimeout):
            return MetricsError(
                f"Prometheus is unreachable at {url}: no connection within {timeout:g} s "
                "(connect timeout): a wrong address, or a firewall dropping packets"
            )
        if isinstance(reason, ProtocolError):
            hint = " (an https:// server asked with http://?)" if url.startswith("http:") else ""
            return MetricsError(f"Prometheus at {url} closed the connection without an "
                                f"answer{hint} ({after})")  # fmt: skip
        return MetricsError(f"Prometheus is unreachable at {url}: {type(reason).__name__} "
                            f"({after})")  # fmt: skip

    def _tls_problem(self, text: str) -> str:
        url = self.config.url
        if any(s in text for s in ("WRONG_VERSION_NUMBER", "wrong version number",
                                   "record layer failure", "packet length too long",
                                   "http request")):  # fmt: skip
            plain = "http://" + url.removeprefix("https://")
            return (f"TLS to {url} failed: the server speaks plain HTTP, not HTTPS; "
                    f"use {plain}")  # fmt: skip
        found = re.search(r"\[SSL: [A-Z_]+\][^(]*|certificate verify failed: [^(]*", text)
        detail = (found.group(0) if found else "a TLS error").strip(" ()")
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            if "match" in text:
                return (f"TLS to {url} failed ({detail}): the certificate is for another "
                        "host name; use the name it was issued for")  # fmt: skip
            return (f"TLS to {url} failed ({detail}): the server's certificate is not "
                    "trusted; check --ca-bundle (the CA that signed it)")  # fmt: skip
        return f"TLS to {url} failed ({detail}); check --ca-bundle and the URL"

    def _not_prometheus(self, path: str, what: str) -> MetricsError:
        return MetricsError(
            f"{self.config.url} is not a Prometheus API: {path} answered with {what}; {_BASE_URL}"
        )

    def _result(self, response: requests.Response, path: str) -> list[Any]:
        """The ``data.result`` of a Prometheus answer; anything else as a MetricsError."""
        status, url = response.status_code, self.config.url
        kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        body: Any = None
        if "json" in kind:
            try:
                body = response.json()
            except ValueError:
                body = None
        if status == 200 and isinstance(body, dict) and body.get("status") == "success":
            data = body.get("data")
            result = data.get("result") if isinstance(data, dict) else None
            if isinstance(result, list):
                return result
            raise self._not_prometheus(path, "JSON without data.result")
        if isinstance(body, dict) and body.get("status") == "error":
            return self._refused(status, body)
        code = f"HTTP {status} {response.reason or ''}".strip()
        if status in (401, 403):
            raise MetricsError(f"Prometheus at {url} refused the credentials ({code}): check "
                               "--bearer-token, --bearer-token-file or --basic-auth")  # fmt: skip
        if status == 400 and b"HTTPS server" in response.content[:300]:
            secure = "https://" + url.removeprefix("http://")
            raise MetricsError(f"{url} speaks HTTPS, not plain HTTP; use {secure}")
        if status == 429 or status >= 500:
            again = f" after {self.config.retries} retries" if self.config.retries else ""
            raise MetricsError(f"Prometheus at {url} answered {code}{again}{self._said(response)}")
        what = f"{code}, " + ("an HTML page" if "html" in kind else f"{kind or 'no content type'}")
        raise self._not_prometheus(path, what)

    def _refused(self, status: int, body: dict[str, Any]) -> list[Any]:
        """Prometheus's own error answer (``{"status": "error", "errorType", "error"}``):
        its text, whole."""
        kind = str(body.get("errorType") or f"HTTP {status}")
        reason = _redact(_CONTROL.sub(" ", str(body.get("error") or "no reason given")),
                         self.config.secrets())  # fmt: skip
        if status in (401, 403):
            raise MetricsError(
                f"Prometheus at {self.config.url} refused the credentials ({kind}: {reason})"
            )
        said = _VM_ECHO.sub("", reason)
        too_big = kind == "timeout" or any(w in said for w in _TOO_BIG)
        hint = f"; {_NARROW}" if too_big else ""
        raise MetricsError(f"Prometheus refused a query ({kind}): {reason}{hint}", too_big=too_big)

    def _said(self, response: requests.Response) -> str:
        """``: <first line>`` of a short plain-text answer (a proxy's reason), or nothing."""
        if not response.headers.get("Content-Type", "").startswith("text/plain"):
            return ""
        line = response.text.strip().partition("\n")[0][:160]
        line = _redact(_CONTROL.sub(" ", line), self.config.secrets())
        return f": {line}" if line else ""
