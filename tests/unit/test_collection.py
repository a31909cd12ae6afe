"""The ``unthrottle`` process collects cycles rarely: decoding a big answer is not mostly
the collector traversing the operator's long-lived objects (docs/benchmarks.md §9)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from unthrottle.cli.collection import fewer_collections


@pytest.fixture
def thresholds() -> Iterator[None]:
    kept = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*kept)


def _answer(series: int) -> bytes:
    """A Prometheus range answer of ``series`` histogram series, one point each."""
    result = [{"metric": {"namespace": "shop", "pod": f"api-{n // 28}", "container": "app",
                          "le": str(n % 28)}, "values": [[1765000000.0, "12.5"]]}
              for n in range(series)]  # fmt: skip
    return json.dumps({"status": "success", "data": {"result": result}}).encode()


def _young_collections(body: bytes) -> int:
    before = gc.get_stats()[0]["collections"]
    kept = json.loads(body)["data"]["result"]
    after = gc.get_stats()[0]["collections"]
    del kept
    return int(after - before)


def test_a_28000_series_answer_is_decoded_with_a_handful_of_collections(
    thresholds: None,
) -> None:
    body = _answer(28_000)
    gc.set_threshold(700, 10, 10)  # CPython's default
    by_default = _young_collections(body)
    fewer_collections()
    ours = _young_collections(body)
    assert by_default > 100  # one every 700 new objects: what it saves
    assert ours <= 2, f"{ours} collections of the young generation"
    assert gc.get_threshold()[1:] == (10, 10)


def test_every_console_script_starts_with_it() -> None:
    """``unthrottle`` (operator, recommend, agent …) sets it before its command runs."""
    code = ("import gc, sys\nfrom unthrottle.cli import common\n"
            "common.run_guarded(lambda: print(gc.get_threshold()[0]))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "100000"
