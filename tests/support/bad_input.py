"""What test_bad_input.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
TOKEN = "tok-S3cr3t-9f8e7d"
PASSWORD = "pw-S3cr3t-1a2b3c"
KUBE_TOKEN = "kube-S3cr3t-4d5e6f"
HEADER_VALUE = "hdr-S3cr3t-7a8b9c"
SECRETS = (TOKEN, PASSWORD, KUBE_TOKEN, HEADER_VALUE)
DEADLINE_S = 40.0
"""No case may take longer: the slowest waits on purpose for a few seconds."""
SCENARIO = "name: {name}\nworkload: {{kind: serial, task_cpu_ms: 1, tasks: 2}}\nruns: [{run}]\n"


@dataclass(frozen=True)
class Case:
    """One bad input: the arguments (``{name}`` fields filled from the fixtures), the exit
    status it must end with, and the text the ``error:`` line must hold."""

    id: str
    argv: tuple[str, ...]
    code: int
    names: str
    env: dict[str, str] = field(default_factory=dict)
    usage: bool = False
    """Refused by the option parser itself (a usage panel, not an ``error:`` line)."""


def case(id: str, *argv: str, code: int = 2, names: str = "", env: dict[str, str] | None = None,
         usage: bool = False) -> Case:  # fmt: skip
    return Case(id, argv, code, names or next(a for a in argv if a.startswith("-")), env or {},
                usage)  # fmt: skip


REC = ("recommend", "--no-cluster", "--prometheus", "http://127.0.0.1:1", "--retries", "0")
"""recommend with options good enough to reach the network (a refused port)."""


def rec(id: str, *argv: str, names: str = "", env: dict[str, str] | None = None,
        usage: bool = False, code: int = 2) -> Case:  # fmt: skip
    """A recommend case: its own arguments after :data:`REC`; by default the error names
    the first flag among them."""
    names = names or next(a for a in argv if a.startswith("-"))
    return case(f"recommend-{id}", *REC, *argv, names=names, env=env, usage=usage, code=code)


def _prometheus_urls() -> list[Case]:
    bad = {
        "not-a-url": "notaurl", "empty": "", "no-host": "http://", "https-no-host": "https://",
        "ftp": "ftp://x", "file": "file:///etc/passwd", "port-too-big": "http://127.0.0.1:99999",
        "port-zero": "http://127.0.0.1:0", "port-letters": "http://127.0.0.1:abc",
        "port-negative": "http://x:-1", "ipv6-unclosed": "http://[::1",
        "ipv6-junk-after": "http://[::1]x:9", "ipv6-not-an-address": "http://[zz::1]:9",
        "space-inside": "http://exa mple", "space-before": " http://x", "newline": "http://x\n",
        "empty-label": "http://a..b", "api-path": "http://x/api/v1", "api-path-slash":
        "http://x/api/v1/", "query-path": "http://x/api/v1/query", "query": "http://x?y=1",
        "fragment": "http://x#f", "host-port-only": "localhost:9090", "scheme-relative":
        "//x:9090", "escape-sequence": "http://\x1b[31mx", "label-too-long": "http://" + "a" * 64,
        "javascript": "javascript:alert(1)", "markup": "http://[/x]",
    }  # fmt: skip
    cases = [case(f"recommend-url-{k}", "recommend", "--no-cluster", "--prometheus", v,
                  names="--prometheus") for k, v in bad.items()]  # fmt: skip
    cases.append(case("recommend-url-credentials", "recommend", "--no-cluster", "--prometheus",
                      f"http://ops:{PASSWORD}@prom:9090", names="holds credentials"))  # fmt: skip
    return cases


def _numbers() -> list[Case]:
    cases = []
    for flag, values in {
        "--timeout": ["0", "-1", "nan", "inf", "-inf", "1e308", "3601"],
        "--retries": ["-1", "11", "1000000"],
        "--target": ["0", "1", "2", "-0.5", "nan", "inf"],
        "--concurrency": ["0", "-1", "65", "100000000"],
        "--jobs": ["0", "-3"],
        "--top": ["0", "-1"],
    }.items():
        cases += [rec(f"{flag[2:]}-{v}", flag, v) for v in values]
    for flag, value in (("--timeout", "abc"), ("--retries", "x"), ("--target", "x"),
                        ("--top", "1.5")):  # fmt: skip
        cases.append(rec(f"{flag[2:]}-{value}-usage", flag, value, usage=True))
    return cases


def _texts() -> list[Case]:
    cases = []
    for flag, values in {
        "--window": ["²d", "seven days", "0s", "30", "-1h", "1d1d", "1h1d", "400d", "", "7d ",
                     "1e3s", "٣d", "30s"],
        "--deadline": ["0s", "forever", "²m", "-5m", "400d"],
        "--history": ["sometimes", ""],
        "--format": ["xml", "", "kustomize"],
        "--selector": ["app=web,,x", "=x", "a in (", "[/x]", "a=b=c"],
        "--namespace": ["[/x]", "Shop", "a_b", "-x", "x" * 64, "", "\x1b[31mred"],
        "--cfs-period": ["0ms", "999us", "2s", "100", "fast", "-100ms", "", "100 ms",
                         "1.0005ms", "1e2ms"],
    }.items():  # fmt: skip
        cases += [rec(f"{flag[2:]}-{i}", flag, v) for i, v in enumerate(values)]
    cases.append(rec("strategy-usage", "--strategy", "Sometimes", usage=True))
    return cases


def _headers_and_secrets() -> list[Case]:
    token_env = "UNTHROTTLE_PROMETHEUS_TOKEN"
    auth_env = "UNTHROTTLE_PROMETHEUS_BASIC_AUTH"
    return [
        rec("header-no-equals", "--header", "nonsense"),
        rec("header-no-name", "--header", "=v"),
        rec("header-crlf", "--header", f"X-Key={HEADER_VALUE}\r\nX-Evil: 1"),
        rec("header-not-latin-1", "--header", f"X-Key={HEADER_VALUE}€"),
        rec("header-space-in-name", "--header", f"X Key={HEADER_VALUE}"),
        rec("header-escape", "--header", f"X-Key={HEADER_VALUE}\x1b[2J"),
        rec("header-leading-space", "--header", f"X-Key= {HEADER_VALUE}"),
        rec("header-twice", "--header", "X-A=1", "--header", "X-A=2"),
        rec("header-colon-not-equals", "--header", f"X-Key: {HEADER_VALUE}"),
        rec("token-inner-newline", "--bearer-token", f"{TOKEN}\nX-Evil: 1"),
        rec("token-space", "--bearer-token", f"{TOKEN} x"),
        rec("token-not-ascii", "--bearer-token", f"{TOKEN}é"),
        rec("token-empty", "--bearer-token", ""),
        rec("token-control-from-env", env={token_env: f"{TOKEN}\x01"}, names=token_env),
        rec("token-space-from-env", env={token_env: f"{TOKEN} {TOKEN}"}, names=token_env),
        rec("token-file-missing", "--bearer-token-file", "/nonexistent/token"),
        rec("token-file-a-directory", "--bearer-token-file", "/tmp"),
        rec("token-file-nul", "--bearer-token-file", "{files}/token-nul"),
        rec("token-file-empty", "--bearer-token-file", "{files}/token-empty"),
        rec("token-and-token-file", "--bearer-token", TOKEN, "--bearer-token-file",
            "{files}/token-good", names="--bearer-token and --bearer-token-file"),
        rec("basic-auth-no-colon", "--basic-auth", "nocolon"),
        rec("basic-auth-no-user", "--basic-auth", f":{PASSWORD}"),
        rec("basic-auth-control", "--basic-auth", f"ops:{PASSWORD}\x07"),
        rec("basic-auth-from-env", env={auth_env: PASSWORD}, names=auth_env),
        rec("ca-bundle-missing", "--ca-bundle", "/nonexistent/ca.pem", "--prometheus",
            "https://127.0.0.1:1"),
        rec("ca-bundle-with-http", "--ca-bundle", "{files}/not-pem"),
        rec("ca-bundle-not-pem", "--ca-bundle", "{files}/not-pem", "--prometheus",
            "https://127.0.0.1:1"),
        rec("ca-bundle-a-directory", "--ca-bundle", "/tmp", "--prometheus", "https://x:1"),
        rec("ca-bundle-and-insecure", "--ca-bundle", "{files}/not-pem", "--insecure",
            "--prometheus", "https://127.0.0.1:1", names="--ca-bundle and --insecure"),
    ]  # fmt: skip


def _files() -> list[Case]:
    return [
        rec("output-missing-folder", "--output", "/nonexistent/dir/f"),
        rec("output-root", "--output", "/"),
        rec("output-proc-file", "--output", "/proc/self/status"),
        rec("output-proc-sys", "--output", "/proc/sys/kernel/hostname"),
        rec("output-a-directory", "--output", "{files}"),
        rec("output-kustomize-into-a-file", "--output", "{files}/not-pem", "--format",
            "kustomize"),
        rec("output-kustomize-in-proc", "--output", "/proc/self/x", "--format", "kustomize"),
        rec("kubeconfig-with-no-cluster", "--kubeconfig", "{files}/kc-refused",
            names="--kubeconfig and --no-cluster"),
        case("recommend-kubeconfig-missing", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "/nonexistent/kc", names="not found; or run with --no-cluster"),
        case("recommend-kubeconfig-a-directory", "recommend", "--prometheus",
             "http://127.0.0.1:1", "--kubeconfig", "/tmp", names="--kubeconfig"),
        case("recommend-kubeconfig-not-one", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "/etc/passwd", names="is not a kubeconfig"),
        case("recommend-kubeconfig-bad-yaml", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "{files}/kc-bad-yaml", names="is not YAML (line"),
        case("recommend-kubeconfig-a-list", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "{files}/kc-list", names="is not a kubeconfig"),
        case("recommend-kubeconfig-env-missing", "recommend", "--prometheus",
             "http://127.0.0.1:1", env={"KUBECONFIG": "/nonexistent/a:/nonexistent/b"},
             names="$KUBECONFIG"),
        case("recommend-no-kubeconfig-at-all", "recommend", "--prometheus", "http://127.0.0.1:1",
             names="no kubeconfig"),
    ]  # fmt: skip


def _network() -> list[Case]:
    """The environment is wrong (exit 1): each way a server can fail, told apart."""
    fast = ("--retries", "1")
    return [
        rec("refused", names="connection refused", code=1),
        rec("dns", "--prometheus", "http://nonexistent.invalid:9090", names="is not known", code=1),
        rec("never-answers", "--prometheus", "{hang}", "--timeout", "2",
            names="did not answer within 2 s (read timeout", code=1),
        rec("deadline", "--prometheus", "{hang}", "--deadline", "3s", "--timeout", "30",
            names="--deadline 3s: gave up after 3 s while querying Prometheus", code=1),
        rec("https-against-http", "--prometheus", "https://{web}/empty",
            names="speaks plain HTTP, not HTTPS; use http://", code=1),
        rec("ordinary-web-server", "--prometheus", "http://{web}/html404", *fast,
            names="is not a Prometheus API: /api/v1/query answered with HTTP 404", code=1),
        rec("single-page-app", "--prometheus", "http://{web}/spa", *fast,
            names="answered with HTTP 200 OK, an HTML page", code=1),
        rec("wrong-json", "--prometheus", "http://{web}/garbage", *fast,
            names="is not a Prometheus API", code=1),
        rec("prometheus-error-text", "--prometheus", "http://{web}/promerror", *fast,
            names='invalid parameter "query": 1:8: parse error: unexpected "}" in label', code=1),
        rec("credentials-refused", "--prometheus", "http://{web}/denied", "--bearer-token",
            TOKEN, *fast, names="refused the credentials (HTTP 401", code=1),
        rec("proxy-echoes-the-token", "--prometheus", "http://{web}/echo503", "--bearer-token",
            f"{TOKEN}\n", *fast, names="answered HTTP 503", code=1),
        rec("no-deployments", "--prometheus", "http://{web}/empty", "--basic-auth",
            f"ops:{PASSWORD}", "--header", f"X-Key={HEADER_VALUE}", names="no Deployments", code=1),
        case("recommend-kube-never-answers", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "{files}/kc-hang", "--deadline", "6s",
             names="did not answer within 3 s (read timeout)", code=1),
        case("recommend-kube-refused", "recommend", "--prometheus", "http://127.0.0.1:1",
             "--kubeconfig", "{files}/kc-refused", names="connection refused", code=1),
        case("report-kube-refused", "report", "p", "--kubeconfig", "{files}/kc-refused",
             names="cannot read ConfigMap default/p-report", code=1),
    ]  # fmt: skip


def _simulate_and_lab() -> list[Case]:
    scenario = "{files}/good.yaml"
    cases = []
    for flag, values in {
        "--hz": ["7", "99", "1001", "1000000000", "0", "-1"],
        "--cores": ["0", "-1", "1025", "100000000"],
        "--phase-ms": ["inf", "nan", "-1", "1001", "1e308"],
        "--tick-phase-ms": ["inf", "-1"],
        "--wakeup-ms": ["inf", "nan", "1e308"],
    }.items():
        cases += [case(f"simulate{flag[1:]}-{v}", "simulate", flag, v, scenario) for v in values]
    cases.append(case("simulate-hz-usage", "simulate", "--hz", "x", scenario, usage=True))
    for name in ("inf-cpus", "huge-cpus", "inf-rate", "ansi-name", "bad-yaml", "binary",
                 "a-list", "empty"):  # fmt: skip
        cases.append(case(f"simulate-file-{name}", "simulate", f"{{files}}/{name}.yaml",
                          names=f"{name}.yaml"))  # fmt: skip
    cases += [
        case("simulate-file-missing", "simulate", "/nonexistent.yaml", names="nonexistent.yaml"),
        case("simulate-file-a-directory", "simulate", "/tmp", names="/tmp"),
        case("lab-run-phase-inf", "lab", "run", "--phase-ms", "inf", scenario),
        case("lab-run-phase-nan", "lab", "run", "--phase-ms", "nan", scenario),
        case("lab-run-file-missing", "lab", "run", "/nonexistent.yaml", names="nonexistent"),
    ]
    tune = {"--target": ["0", "2", "nan"], "--headroom": ["-1", "nan", "inf", "11"]}
    for flag, values in tune.items():
        cases += [case(f"lab-tune{flag[1:]}-{v}", "lab", "tune", flag, v, scenario) for v in values]
    cases.append(case("lab-tune-file-missing", "lab", "tune", "/nonexistent.yaml",
                      names="nonexistent"))  # fmt: skip
    return cases


def _agent() -> list[Case]:
    here = ("--listen", "127.0.0.1:0")  # last: the error names the case's own flag first
    return [
        case("agent-cgroup-root-missing", "agent", "--cgroup-root", "/nonexistent",
             "--standalone", *here),
        case("agent-cgroup-root-escapes", "agent", "--cgroup-root", "../../../etc",
             "--standalone", *here),
        case("agent-standalone-kubeconfig", "agent", "--standalone", "--kubeconfig", "/x", *here,
             names="--kubeconfig and --standalone"),
        *(case(f"agent-listen-{i}", "agent", "--listen", v) for i, v in enumerate(
            ["127.0.0.1:²", "nohost", ":9717", "127.0.0.1:65536", "127.0.0.1:-1", "x:"])),
        *(case(f"agent-period-{i}", "agent", "--period", v, *here) for i, v in enumerate(
            ["0ms", "inf", "²ms", "100", "61s", "-1s"])),
        case("agent-peak-shorter-than-period", "agent", "--period", "100ms",
             "--peak-window", "10ms", *here, names="--peak-window"),
        case("agent-discover-every-zero", "agent", "--discover-every", "0s", *here),
        case("agent-log-level", "agent", "--log-level", "loud", *here),
        case("agent-burst-threshold-nan", "agent", "--burst-node-threshold", "nan", *here,
             usage=True),
        case("agent-burst-threshold-usage", "agent", "--burst-node-threshold", "2", *here,
             usage=True),
        case("agent-burst-without-namespaces", "agent", "--burst", *here,
             names="--burst needs --burst-namespace"),
        case("agent-burst-namespace-without-burst", "agent", "--burst-namespace", "shop",
             *here, names="--burst-namespace without --burst"),
        case("agent-burst-namespace-bad", "agent", "--burst", "--burst-namespace", "Shop_1",
             *here),
        case("agent-burst-standalone", "agent", "--burst", "--burst-namespace", "shop",
             "--standalone", *here, names="--burst and --standalone"),
        case("agent-kubeconfig-missing", "agent", "--kubeconfig", "/nonexistent/kc", *here,
             names="not found; or run with --standalone"),
        case("agent-kubeconfig-not-one", "agent", "--kubeconfig", "/etc/passwd", *here,
             names="is not a kubeconfig"),
        case("agent-no-kubeconfig", "agent", *here, names="or run with --standalone"),
    ]  # fmt: skip


def _operator_report_and_more() -> list[Case]:
    url = ("--prometheus", "http://127.0.0.1:1")

    def op(id: str, *argv: str, names: str = "", env: dict[str, str] | None = None) -> Case:
        return case(f"operator-{id}", "operator", *argv, *url, names=names, env=env)

    return [
        *(case(f"operator-url-{i}", "operator", "--prometheus", v, names="--prometheus")
          for i, v in enumerate(["notaurl", "", "ftp://x", "http://[::1",
                                 f"http://ops:{PASSWORD}@x"])),
        op("timeout-nan", "--timeout", "nan"),
        op("retries-negative", "--retries", "-1"),
        op("header-crlf", "--header", f"X-Key={HEADER_VALUE}\r\n"),
        op("token-control", "--bearer-token", f"{TOKEN}\x7f"),
        op("ca-bundle-missing", "--ca-bundle", "/nonexistent", "--prometheus", "https://x:1"),
        op("namespace-markup", "--namespace", "[/x]"),
        op("namespace-and-all", "--namespace", "a", "--all-namespaces"),
        op("peering-and-standalone", "--peering", "x", "--standalone"),
        op("peering-lifetime-short", "--peering", "x", "--peering-lifetime", "5",
           names="--peering-lifetime"),
        op("log-format", "--log-format", "xml"),
        op("status-zero", "--status-max-workloads", "0"),
        op("status-huge", "--status-max-workloads", "100000"),
        op("cfs-period-too-long", "--cfs-period", "10s"),
        op("cfs-period-from-env", env={"UNTHROTTLE_CFS_PERIOD": "fast"}, names="--cfs-period"),
        op("liveness", "--liveness", "nohost:x"),
        op("metrics-port", "--metrics", "127.0.0.1:99999"),
        op("no-kubeconfig", env={"KUBECONFIG": "/nonexistent/kc"},
           names="$KUBECONFIG: /nonexistent/kc not found"),
        op("kubeconfig-bad-yaml", env={"KUBECONFIG": "{files}/kc-bad-yaml"},
           names="is not YAML"),
        *(case(f"report-policy-{i}", "report", v, names="POLICY") for i, v in enumerate(
            ["[/x]", "UPPER", "", "a" * 254, "\x1b[2Jx"])),
        case("report-namespace", "report", "p", "-n", "[/x]", names="--namespace"),
        case("report-format", "report", "p", "--format", "xml"),
        case("report-kustomize-no-output", "report", "p", "--format", "kustomize"),
        case("report-output-missing-folder", "report", "p", "--output", "/nonexistent/x"),
        case("report-kubeconfig-missing", "report", "p", "--kubeconfig", "/nonexistent/kc"),
        case("report-no-kubeconfig", "report", "p", names="no kubeconfig"),
        case("unknown-option", "--bogus", usage=True),
        case("unknown-command", "nosuchcommand", names="nosuchcommand", usage=True),
        case("simulate-no-file", "simulate", names="Missing argument", usage=True),
    ]  # fmt: skip


CASES = [*_prometheus_urls(), *_numbers(), *_texts(), *_headers_and_secrets(), *_files(),
         *_network(), *_simulate_and_lab(), *_agent(), *_operator_report_and_more()]  # fmt: skip
NEEDS_CGROUPS = {
    "agent-cgroup-root-missing",
    "agent-cgroup-root-escapes",
    "agent-kubeconfig-missing",
    "agent-kubeconfig-not-one",
    "agent-no-kubeconfig",
}
"""Cases that reach the agent's cgroup layout: elsewhere it is an environment error."""


# -- servers and files the cases use -------------------------------------------------------

_CANNED: dict[str, tuple[int, str, str]] = {
    "html404": (404, "text/html", "<!DOCTYPE html><html><body><h1>Not Found</h1></body></html>"),
    "spa": (200, "text/html; charset=utf-8", "<!DOCTYPE html><html><body>app</body></html>"),
    "garbage": (200, "application/json", '{"status": "success", "data": {"result": [{"metric": '
                '{}, "value": "x"}]}}'),
    "promerror": (400, "application/json", json.dumps({"status": "error",
                  "errorType": "bad_data", "error": 'invalid parameter "query": 1:8: parse '
                  'error: unexpected "}" in label matching, expected string'})),
    "denied": (401, "text/plain", "Unauthorized"),
    "empty": (200, "application/json",
              '{"status": "success", "data": {"resultType": "vector", "result": []}}'),
}  # fmt: skip


class _Web(BaseHTTPRequestHandler):
    """An ordinary web server with a few canned answers, by the base URL's first segment;
    ``echo503`` repeats the Authorization header it got, as a careless proxy might."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        first = self.path.strip("/").split("/")[0]
        type(self).seen.append(self.path)
        if first == "echo503":
            status, kind = 503, "text/plain"
            body = f"upstream failed for {self.headers.get('Authorization')}"
        else:
            status, kind, body = _CANNED.get(first, _CANNED["html404"])
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    """``127.0.0.1:PORT`` of the web server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _kubeconfig(server: str) -> str:
    return (f"apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: "
            f"'{server}'}}}}]\nusers: [{{name: u, user: {{token: {KUBE_TOKEN}, password: "
            f"{PASSWORD}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n"
            "current-context: x\n")  # fmt: skip


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """The user's environment without any kubeconfig, token or cluster of this machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UNTHROTTLE_", "KUBE")) and k != "HOME"}  # fmt: skip
    return {**env, "HOME": str(home), **extra}


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, ended if it outlives the deadline (a hang). The cases
    spell the laboratory's commands ``lab run`` and ``simulate``: ``unthrottle-lab``'s."""
    binary = UNTHROTTLE_LAB if argv[:1] in (["lab"], ["simulate"]) else UNTHROTTLE
    argv = argv[1:] if argv[:1] == ["lab"] else argv
    try:
        return subprocess.run([str(binary), *argv], capture_output=True, text=True,
                              timeout=DEADLINE_S, env=env, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: no answer within {DEADLINE_S:g} s: {argv}")


def assert_clear(out: subprocess.CompletedProcess[str], c: Case) -> None:
    """The answer a user can act on, and nothing they would regret."""
    shown = out.stdout + out.stderr
    assert "Traceback" not in shown and "internal error" not in shown, out.stderr
    for secret in SECRETS:
        assert secret not in shown, f"a secret was printed: {out.stderr}"
    assert "<html" not in shown.lower() and "\x1b[" not in out.stderr, out.stderr
    assert out.returncode == c.code, out.stderr
    lines = out.stderr.splitlines()
    if c.usage:  # click's panel: the option named on one of its lines
        assert any(c.names in line for line in lines), out.stderr
        return
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and c.names in errors[0], out.stderr
    assert len(lines) <= 4, out.stderr  # the error, a note or two: never a dump
