"""Every bad input gets a clear answer: the real command, in a subprocess, as a user runs it.

Each case is one hostile but realistic input to one of the commands. Whatever it is, the
answer is an exit status (2 for a bad option or file, 1 for the environment), an
``error:`` line naming the option or the field, and nothing else a user would regret: no
traceback, no hang (a deadline per case), no secret in stdout or stderr (where the agent
and the operator log), no HTML dump. ``docs/benchmarks.md`` ("Reliability: bad input")
records the count.
"""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.bad_input import (
    CASES,
    DEADLINE_S,
    KUBE_TOKEN,
    NEEDS_CGROUPS,
    REC,
    SCENARIO,
    TOKEN,
    UNTHROTTLE,
    Case,
    _env,
    _kubeconfig,
    _Web,
    assert_clear,
    run,
)
from support.machine import KERNEL_LAYOUT
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource


@pytest.fixture(scope="module")
def hang() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, hang: str) -> Path:
    folder = tmp_path_factory.mktemp("bad-input")
    texts = {
        "token-nul": f"{TOKEN}\x00\n", "token-empty": "\n", "token-good": f"{TOKEN}\n",
        "not-pem": "this is no certificate\n",
        "kc-hang": _kubeconfig(hang), "kc-refused": _kubeconfig("http://127.0.0.1:1"),
        "kc-bad-yaml": f"users:\n- name: u\n  user: {{token: {KUBE_TOKEN}\n  : [\n",
        "kc-list": "- a\n- b\n",
        "good.yaml": SCENARIO.format(name="good", run="{cpus: 1}"),
        "inf-cpus.yaml": SCENARIO.format(name="x", run="{cpus: .inf}"),
        "huge-cpus.yaml": SCENARIO.format(name="x", run="{cpus: 1e308}"),
        "inf-rate.yaml": "name: x\nworkload: {kind: open, task_cpu_ms: 1, rate_per_s: .inf}\n"
                         "runs: [{cpus: 1}]\n",
        "ansi-name.yaml": SCENARIO.format(name='"\\e[31mred\\e[0m"', run="{cpus: 1}"),
        "bad-yaml.yaml": "name: [\n", "a-list.yaml": "- 1\n- 2\n", "empty.yaml": "",
        "markup.yaml": SCENARIO.format(name='"[/x] [bold]b :smile:"', run="{cpus: 1}"),
    }  # fmt: skip
    for name, text in texts.items():
        (folder / name).write_text(text)
    (folder / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    return folder


@pytest.fixture(scope="module")
def outcomes(
    files: Path, web: str, hang: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every case's outcome; two at a time (the slow ones only wait)."""
    home = tmp_path_factory.mktemp("home")
    fill = {"files": str(files), "web": web, "hang": hang}

    def one(c: Case) -> subprocess.CompletedProcess[str]:
        argv = [a.format(**fill) if "{" in a and "}" in a else a for a in c.argv]
        env = {k: v.format(**fill) for k, v in c.env.items()}
        return run(argv, _env(home, env))

    with ThreadPoolExecutor(2) as pool:
        return dict(zip((c.id for c in CASES), pool.map(one, CASES), strict=True))


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_gets_a_clear_answer(
    c: Case, outcomes: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    if c.id in NEEDS_CGROUPS and KERNEL_LAYOUT is None:
        pytest.skip("the --cgroup-root check needs a cgroup hierarchy")
    assert_clear(outcomes[c.id], c)


def test_a_stripped_token_file_and_the_flags_reach_the_server_and_never_the_screen(
    outcomes: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # the token with its trailing newline was sent (the proxy echoed it), and hidden
    echoed = outcomes["recommend-proxy-echoes-the-token"].stderr
    assert "upstream failed for Bearer ***" in echoed
    assert "after 1 retries" in echoed


def test_options_are_checked_before_any_query(files: Path, web: str, tmp_path: Path) -> None:
    _Web.seen.clear()
    out = run([*REC, "--prometheus", f"http://{web}/empty", "--output", "/nonexistent/dir/f"],
              _env(tmp_path, {}))  # fmt: skip
    assert out.returncode == 2 and "--output" in out.stderr
    assert _Web.seen == []  # not one query was sent


def test_jobs_beyond_the_usable_cpus_are_capped_and_said(web: str, tmp_path: Path) -> None:
    out = run([*REC, "--prometheus", f"http://{web}/empty", "--jobs", "100000"], _env(tmp_path, {}))
    cpus = len(os.sched_getaffinity(0))
    assert f"note: --jobs 100000: this machine has {cpus} usable CPUs; using {cpus}" in out.stderr
    assert out.returncode == 1 and "no Deployments" in out.stderr


def test_a_name_with_markup_is_printed_as_itself(files: Path, tmp_path: Path) -> None:
    out = run(["simulate", "--cores", "2", str(files / "markup.yaml")], _env(tmp_path, {}))
    assert out.returncode == 0, out.stderr
    assert "[/x] [bold]b :smile:" in out.stdout


@pytest.mark.kernel
def test_lab_run_prints_its_results_whatever_the_scenario_is_called(
    files: Path, tmp_path: Path
) -> None:
    out = run(["lab", "run", str(files / "markup.yaml")], _env(tmp_path, {}))
    assert out.returncode == 0, out.stderr
    assert "[/x] [bold]b :smile:" in out.stdout and "1 CPU" in out.stdout


def test_a_terminal_sees_what_the_command_waits_on_while_it_waits(hang: str) -> None:
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [str(UNTHROTTLE), *REC, "--prometheus", hang, "--timeout", "3"], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=secondary, env={**os.environ, "TERM": "xterm"},
    )  # fmt: skip
    os.close(secondary)
    seen, began = b"", time.monotonic()
    while time.monotonic() - began < DEADLINE_S:
        ready, _, _ = select.select([main], [], [], 1)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
    os.close(main)
    assert proc.wait(timeout=DEADLINE_S) == 1
    text = seen.decode(errors="replace")
    assert f"querying Prometheus at {hang}" in text and "0:00:0" in text  # the elapsed time
    assert "did not answer within 3 s (read timeout" in text


class TestTheOneWayToPrintUserText:
    def test_escape_sequences_are_removed_and_controls_shown(self) -> None:
        from unthrottle.cli.text import plain

        assert plain("\x1b[31mred\x1b[0m \x1b]0;title\x07x") == "red x"
        assert plain("a\x07b\nc") == "a\\x07b\nc"
        assert plain("a\nb", one_line=True) == "a\\x0ab"

    def test_a_hidden_secret_is_never_printed(self) -> None:
        from unthrottle.cli.text import hide, plain

        hide("another-S3cr3t")
        assert plain("Bearer another-S3cr3t!") == "Bearer ***!"


def test_output_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    from unthrottle.cli.report_cmd import write_output

    target = tmp_path / "report.md"
    target.write_text("the old report\n")
    target.chmod(0o640)
    write_output("the new report\n", target)
    assert target.read_text() == "the new report\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary left


def test_the_suite_tries_as_many_bad_inputs_as_the_issue_did() -> None:
    assert len(CASES) >= 203
    assert len({c.id for c in CASES}) == len(CASES)


@requires_prometheus
def test_prometheus_s_own_error_text_is_shown_whole(tmp_path: Path) -> None:
    with PrometheusServer(tmp_path) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url, retries=0))
        with pytest.raises(MetricsError) as refused:
            source.instant('sum(up{job="a"}')
    # Prometheus's text has quotes of its own: all of it is there, unescaped
    assert 'Prometheus refused a query (bad_data): invalid parameter "query": ' in str(
        refused.value
    )
    assert "unclosed left parenthesis" in str(refused.value)


@requires_prometheus
def test_http_to_an_https_prometheus_says_to_use_https(
    https: tuple[str, Path],
) -> None:
    url, _ = https
    plain_url = url.replace("https://", "http://")
    with pytest.raises(MetricsError, match=f"speaks HTTPS, not plain HTTP; use {url}"):
        PrometheusSource(PrometheusConfig(plain_url, retries=0)).instant("vector(1)")
