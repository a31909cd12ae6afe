"""Generated bad input: hypothesis throws scenario YAML at ``simulate`` and option strings at
``recommend``, each run as a user runs it (a subprocess), and asserts what
``test_bad_input`` asserts of the hand-written cases: an exit status of 0, 1 or 2, an
``error:`` line that names the file or an option given, no traceback, no secret, no hang.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.bad_input import (
    SECRETS,
    TOKEN,
    _env,
    run,
)

EXAMPLES = settings(
    max_examples=40,
    deadline=None,  # each example is a process: its own deadline is run()'s
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
HOSTILE = ["[/x]", "\x1b[31m", ":smile:", "\\", "é€", "\r\n", "", " ", "-1", "nan", "inf",
           ".inf", "1e308", "²", "٣", "0", "[bold]", "%s", "{}", "null", "true"]  # fmt: skip
"""Hostile text, but no secret: a token is one only where a secret goes (it may be quoted
back anywhere else, as the user's own typo)."""
text = st.sampled_from(HOSTILE) | st.text(max_size=12)
argument = st.sampled_from(HOSTILE) | st.text(st.characters(exclude_characters="\x00"),
                                              max_size=12)  # fmt: skip
"""Hostile text for a command-line argument: anything but NUL, which no argv can hold."""
number = (st.integers(-10, 10) | st.floats(-1e3, 1e3) | st.integers(-(10**12), 10**12)
          | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -0.0]))  # fmt: skip
scalar = number | text | st.booleans() | st.none()
value = scalar | st.lists(scalar, max_size=2) | st.dictionaries(text, scalar, max_size=2)
small = st.integers(1, 5) | st.floats(0.5, 20)  # valid enough to run, and run fast


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, value)  # mostly plausible, often not


@st.composite
def scenario_text(draw: st.DrawFn) -> str:
    """A scenario file: a plausible one, bent in a few places, or plain garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    workload = {
        "kind": draw(_field(st.sampled_from(["serial", "batch", "open"]))),
        "task_cpu_ms": draw(_field(small)),
        "tasks": draw(_field(st.integers(1, 5))),
    }
    for key, valid in (
        ("workers", st.integers(1, 3)),
        ("think_ms", small),
        ("rate_per_s", st.floats(10, 200)),
        ("seed", st.integers(0, 9)),
    ):
        if draw(st.booleans()):
            workload[key] = draw(_field(valid))
    runs = draw(
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "cpus": _field(st.floats(0.1, 4)),
                    "period_ms": _field(st.sampled_from([10, 100])),
                    "burst_ms": _field(st.sampled_from([0, 5])),
                    draw(text): value,
                },
            ),
            max_size=3,
        )
    )
    doc: dict[Any, Any] = {
        "name": draw(_field(st.text("abc-[]/:", min_size=1, max_size=8))),
        "workload": workload,
        "runs": runs,
    }
    if draw(st.booleans()):
        doc.pop(draw(st.sampled_from(["name", "workload", "runs"])))
    return yaml.safe_dump(doc, allow_unicode=True)  # fmt: skip


def assert_sane(out: subprocess.CompletedProcess[str], named: list[str]) -> None:
    """No traceback, no secret, a known status; an error names one of ``named``."""
    shown = out.stdout + out.stderr
    assert "Traceback" not in shown and "internal error" not in shown, out.stderr
    assert not any(secret in shown for secret in SECRETS), out.stderr
    assert out.returncode in (0, 1, 2), out.stderr
    if out.returncode == 2:
        assert any(name in out.stderr for name in named), out.stderr


@EXAMPLES
@given(body=scenario_text(), phase=st.sampled_from(["0", "5", "inf", "nan", "-1", "1e308"]))
def test_simulate_answers_any_scenario_file_clearly(
    body: str, phase: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("gen") / "generated.yaml"
    path.write_text(body)
    home = tmp_path_factory.mktemp("home")
    out = run(["simulate", "--cores", "2", "--hz", "250", "--phase-ms", phase, str(path)],
              _env(home, {}))  # fmt: skip
    assert_sane(out, ["generated.yaml", "--phase-ms"])
    if out.returncode == 2 and "generated.yaml" in out.stderr:
        assert "nothing was run" in out.stderr and out.stdout == ""


FLAGS: dict[str, st.SearchStrategy[str]] = {
    "--window": st.sampled_from(["7d", "1h", "1h30m", "30s", "0s", "²d", "400d"]) | argument,
    "--target": st.sampled_from(["0.05", "0.5", "0", "1", "nan", "inf", "-1"]) | argument,
    "--timeout": st.sampled_from(["5", "0.001", "0", "nan", "inf", "3601"]) | argument,
    "--retries": st.sampled_from(["0", "3", "10", "11", "-1"]) | argument,
    "--concurrency": st.sampled_from(["1", "3", "64", "65", "0"]) | argument,
    "--jobs": st.sampled_from(["1", "2", "100000", "0"]) | argument,
    "--top": st.sampled_from(["1", "5", "0", "-1"]) | argument,
    "--deadline": st.sampled_from(["5m", "30s", "1s", "0s", "forever"]) | argument,
    "--history": st.sampled_from(["auto", "raw", "recorded", "sometimes"]) | argument,
    "--format": st.sampled_from(["json", "yaml", "csv", "table", "kustomize", "xml"]) | argument,
    "--namespace": st.sampled_from(["shop", "Shop", "[/x]", "a-b"]) | argument,
    "--selector": st.sampled_from(["app=web", "tier in (a,b)", "a in (", ",,"]) | argument,
    "--header": st.sampled_from(
        [f"X-Key={TOKEN}", "X-Scope-OrgID=t", f"X={TOKEN}\r\n", "=v", f"X-Key={TOKEN}€"]
    )
    | argument,
    "--bearer-token": st.sampled_from([TOKEN, f"{TOKEN}\n", f"{TOKEN}\nX: y", f"{TOKEN} x"]),
    "--output": st.sampled_from(["/", "/nonexistent/x", "/proc/self/status", "{tmp}/out"]),
    "--prometheus": st.sampled_from(
        ["notaurl", "", "http://[::1", "ftp://x", f"http://ops:{TOKEN}@x", "http://x/api/v1/"]
    )
    | argument,
    "--strategy": st.sampled_from(["Auto", "LimitOnly", "never"]),
    "--kubeconfig": st.sampled_from(["/nonexistent", "/etc/passwd"]),
}


@EXAMPLES
@given(options=st.lists(st.sampled_from(sorted(FLAGS)), max_size=4).flatmap(
    lambda flags: st.tuples(*(st.tuples(st.just(f), FLAGS[f]) for f in flags))))  # fmt: skip
def test_recommend_answers_any_options_clearly(
    options: tuple[tuple[str, str], ...],
    web: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("opts")
    argv = ["recommend", "--no-cluster", "--prometheus", f"http://{web}/empty"]
    for flag, given_value in options:
        argv += [flag, given_value.replace("{tmp}", str(tmp))]
    out = run(argv, _env(tmp, {}))
    assert_sane(out, [flag for flag, _ in options])
    assert out.returncode != 0  # the empty Prometheus has nothing to recommend for
    if "Usage:" not in out.stderr:  # not click's own panel: one error line, ours
        assert len([x for x in out.stderr.splitlines() if x.startswith("error: ")]) == 1
