"""The report model: built from a real scan (a real Prometheus, the real Kubernetes API
server) or from its JSON document, the same either way; its totals are the JSON's numbers
added up.

:func:`shop_scan` is the scan the other report tests render.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kube import Kube
from prom import requires_prometheus
from report_size import synthetic
from support.report_model import (
    _containers,
    shop_scan,
)
from unthrottle.report import Report, ReportError, window_text
from unthrottle.scan import ScanResult
from unthrottle_lab.kube import ControlPlane


@pytest.fixture(scope="module")
def result(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[ScanResult]:
    with shop_scan(tmp_path_factory.mktemp("shop"), Kube(control_plane)) as found:
        yield found


@requires_prometheus
class TestBuilt:
    """From a scan or from its JSON, one model."""

    def test_the_json_of_a_plain_scan_round_trips_unchanged(self, result: ScanResult) -> None:
        doc = result.to_json("12h")
        assert Report.from_json(json.loads(json.dumps(doc))).to_json() == doc

    def test_the_report_adds_fields_and_never_drops_one(self, result: ScanResult) -> None:
        plain = result.to_json("12h")
        doc = Report.from_scan(result, window="12h", prometheus="http://p:9090",
                               policy=("shop", "pay")).to_json()  # fmt: skip
        for (_, _, before), (_, _, after) in zip(_containers(plain), _containers(doc),
                                                 strict=True):  # fmt: skip
            assert set(before) <= set(after)
            assert {k: after[k] for k in before} == before
        assert doc["policy"] == {"namespace": "shop", "name": "pay"}
        api = next(w for w in doc["workloads"] if w["deployment"] == "api")
        assert api["labels"] == {"team": "web"} and api["containers"][0]["runtime"] == "go"

    def test_the_shop_is_as_its_demand_implies(self, result: ScanResult) -> None:
        report = Report.from_scan(result)
        names = [w.deployment for w in report.workloads]
        assert names[0] == "checkout" and set(names) == {"checkout", "catalog", "api", "cron"}
        cron = next(w for w in report.workloads if w.deployment == "cron")
        assert not cron.has_evidence() and "no CPU series" in cron.why_not()
        api = next(w for w in report.workloads if w.deployment == "api").containers[0]
        assert api.current.gomaxprocs == 4 and api.histogram


@requires_prometheus
class TestSummary:
    """Totals are the JSON's numbers, added up."""

    def test_cpu_added_and_freed_are_the_sums_of_the_changed_limits(
        self, result: ScanResult
    ) -> None:
        doc = result.to_json("12h")
        deltas = [c["recommendation"]["limit_millicores"] - c["current"]["limit_millicores"]
                  for _, _, c in _containers(doc) if c["recommendation"]]  # fmt: skip
        s = Report.from_json(doc).summary()
        assert s.added_millicores == sum(d for d in deltas if d > 0) > 0
        assert s.freed_millicores == -sum(d for d in deltas if d < 0)
        assert s.raised == sum(1 for d in deltas if d > 0)
        over = [c for _, _, c in _containers(doc) if (c["throttle_ratio"] or 0) > doc["target"]]
        assert s.over_target == len(over) >= 2
        assert s.worst[0].workload.deployment == "checkout"
        assert s.deployments == 4 and s.with_evidence == 3

    def test_harm_is_the_scans_own(self, result: ScanResult) -> None:
        report = Report.from_scan(result)
        for w, mine in zip(result.workloads, report.workloads, strict=True):
            assert mine.harm(result.target) == w.harm(result.target)


class TestProvenance:
    def test_credentials_in_the_prometheus_url_never_reach_a_report(self) -> None:
        url = "https://user:secret@prom.example:9090/api?token=x"
        report = Report.from_scan(synthetic(3, 1), window="7d", prometheus=url)
        assert report.prometheus == "https://prom.example:9090/api"

    @pytest.mark.parametrize(("seconds", "text"), [(604_800, "7d"), (43_200, "12h"),
                                                   (5_400, "90m"), (90, "90s")])  # fmt: skip
    def test_a_window_is_written_as_people_write_it(self, seconds: int, text: str) -> None:
        assert window_text(seconds) == text

    def test_top_keeps_the_most_harmful_and_says_how_many_are_left_out(self) -> None:
        report = Report.from_scan(synthetic(30, 2), window="7d")
        cut = report.top(10)
        assert cut.workloads == report.workloads[:10]
        assert cut.truncated is not None and (cut.truncated.shown, cut.truncated.left_out) == (
            10, 20)  # fmt: skip
        assert cut.top(5).truncated.left_out == 25  # type: ignore[union-attr]
        assert report.top(None) is report and report.top(99) is report


class TestRefused:
    @pytest.mark.parametrize(
        ("doc", "field"),
        [
            ({"window": "7d", "target": 0.05, "workloads": []}, "generated_at"),
            ({"generated_at": "x", "window": "7d", "target": 5, "workloads": []}, "target"),
            ({"generated_at": "x", "window": "7d", "target": 0.05,
              "workloads": [{"namespace": "a", "deployment": "b", "containers": [
                  {"name": "c", "current": {"limit_millicores": "lots"}}]}]},
             "workloads.0.containers.0.current"),
            ([], "the document"),
        ],
        ids=["no generated_at", "target out of range", "a limit that is not a number", "a list"],
    )  # fmt: skip
    def test_a_document_that_is_not_a_report_names_the_field(self, doc: Any, field: str) -> None:
        with pytest.raises(ReportError, match="not an unthrottle report") as error:
            Report.from_json(doc)
        assert field in str(error.value)
