"""The ThrottlePolicy model: defaults, errors for people, the engine's policy, the CRD and docs."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from support.paths import ROOT
from unthrottle.cli.main import app
from unthrottle.model.crd import crd, crd_yaml, spec_reference_markdown, with_reference_tables
from unthrottle.model.durations import format_duration, parse_duration
from unthrottle.model.policy import SpecError, ThrottlePolicySpec, parse_spec
from unthrottle.model.status import ThrottlePolicyStatus
from unthrottle.recommend import Policy, Strategy
from unthrottle.scan import engine_policy
from unthrottle_lab.kube import ControlPlane

CRD_FILE = ROOT / "crds" / "throttlepolicy.yaml"
DOC_FILE = ROOT / "docs" / "throttlepolicy.md"

ISSUE_DEFAULTS = {
    "selector": {"matchLabels": {}, "matchExpressions": []},
    "kinds": ["Deployment"],
    "mode": "Recommend",
    "targetThrottleRatio": 0.05,
    "window": "24h",
    "strategy": "Auto",
    "headroom": 0.1,
    "limits": {"min": "100m", "max": "8", "maxStepUp": 2.0, "maxStepDown": 0.8},
    "burst": {"enabled": True},
    "processors": {"enabled": True},
    "containers": [],
    "apply": {
        "cooldown": "30m",
        "verifyFor": "15m",
        "rollbackIfWorse": True,
        "maxConcurrent": 1,
        "dryRun": False,
        "gitOps": "Skip",
        "method": "Rollout",
    },
    "interval": "5m",
}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _spec_field(name: str) -> dict[str, Any]:
    field: dict[str, Any] = _schema()["properties"]["spec"]["properties"][name]
    return field


def _yaml_blocks(markdown: str) -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", markdown, re.S)]


# --- defaults and valid specs ------------------------------------------------------------


@pytest.mark.parametrize("raw", [{}, None], ids=["empty spec", "no spec"])
def test_an_empty_spec_gets_every_default_of_the_issue(raw: object) -> None:
    assert parse_spec(raw).model_dump(by_alias=True) == ISSUE_DEFAULTS


def test_the_crd_schema_declares_the_same_defaults_the_operator_applies() -> None:
    schema = _schema()["properties"]["spec"]

    def declared(node: dict[str, Any]) -> dict[str, Any]:
        return {
            name: declared(sub) if "properties" in sub else sub.get("default")
            for name, sub in node["properties"].items()
        }

    expected = {k: v for k, v in ISSUE_DEFAULTS.items() if k not in {"selector", "containers"}}
    assert {k: v for k, v in declared(schema).items() if k in expected} == expected
    assert schema["default"] == {}  # so that a policy without a spec is defaulted whole


def test_the_example_in_the_docs_is_a_valid_policy() -> None:
    policy = next(b for b in _yaml_blocks(DOC_FILE.read_text()) if "kind" in b)
    spec = parse_spec(policy["spec"])
    assert spec.limits.max == "4" and spec.containers == ["api"]
    assert spec.label_selector().matches({"tier": "web", "app.kubernetes.io/name": "shop"})


def test_a_kopf_style_read_only_mapping_is_read_like_a_dict() -> None:
    raw = MappingProxyType({"limits": MappingProxyType({"max": "2"}), "containers": ("api",)})
    assert parse_spec(raw).max_millicores == 2000


def test_numbers_given_for_quantities_are_kept_as_quantity_strings() -> None:
    spec = parse_spec({"limits": {"min": 0.25, "max": 8}})
    assert (spec.limits.min, spec.limits.max) == ("0.25", "8")
    assert (spec.min_millicores, spec.max_millicores) == (250, 8000)


def test_a_policy_covers_deployments_only_unless_it_names_other_kinds() -> None:
    """A policy written before ``kinds`` existed covers what it did then: no wider."""
    assert parse_spec({}).kinds == ["Deployment"]
    assert parse_spec({"mode": "Apply", "selector": {"matchLabels": {"app": "web"}}}).kinds == [
        "Deployment"
    ]


def test_a_policy_may_cover_all_three_kinds_of_workload() -> None:
    kinds = ["StatefulSet", "DaemonSet", "Deployment"]
    assert parse_spec({"kinds": kinds}).kinds == kinds


@pytest.mark.parametrize("kind", ["CronJob", "Job", "ReplicaSet", "Rollout"])
def test_a_kind_the_policy_cannot_act_on_is_refused_by_the_model_and_the_schema(
    kind: str,
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({"kinds": ["Deployment", kind]})
    # the operator's condition and event read "spec.kinds[1]: 'CronJob' is not one of ..."
    assert caught.value.field == "kinds[1]"
    assert str(caught.value) == (
        f"kinds[1]: {kind!r} is not one of Deployment, StatefulSet, DaemonSet"
    )
    assert kind not in _spec_field("kinds")["items"]["enum"]


def test_the_schema_offers_exactly_the_kinds_the_model_accepts() -> None:
    kinds = _spec_field("kinds")
    assert kinds["items"]["enum"] == ["Deployment", "StatefulSet", "DaemonSet"]
    assert (kinds["default"], kinds["minItems"]) == (["Deployment"], 1)
    assert kinds["x-kubernetes-list-type"] == "set"  # the API server refuses a duplicate


def test_durations_are_read_in_seconds() -> None:
    spec = parse_spec({"window": "7d", "interval": "1m30s", "apply": {"cooldown": "0s"}})
    assert (spec.window_s, spec.interval_s) == (7 * 86400, 90)
    assert (spec.apply.cooldown_s, spec.apply.verify_for_s) == (0, 900)


# --- bad specs name the field ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        pytest.param({"window": "²d"}, "window", "'²d' is not a duration", id="window ²d"),
        pytest.param({"window": "0s"}, "window", "use at least 5m", id="window 0s"),
        pytest.param({"targetThrottleRatio": 1.5}, "targetThrottleRatio", "< 1", id="ratio 1.5"),
        pytest.param({"limits": {"min": "abc"}}, "limits.min", "e.g. 100m", id="min abc"),
        pytest.param(
            {"limits": {"min": "2", "max": "1"}},
            "limits.min",
            "2 is above limits.max (1): lower limits.min or raise limits.max",
            id="min 2 above max 1",
        ),
        pytest.param({"strategy": "Fast"}, "strategy", "not one of Auto, LimitOnly", id="Fast"),
        pytest.param({"mode": "apply"}, "mode", "case-sensitive: 'Apply'", id="mode lowercase"),
        pytest.param(
            {"prometheus": "http://evil:9090"},
            "prometheus",
            "cannot name a Prometheus",
            id="unknown field prometheus",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "app", "operator": "Like"}]}},
            "selector.matchExpressions[0].operator",
            "'Like' is not one of In, NotIn, Exists, DoesNotExist",
            id="operator Like",
        ),
        pytest.param({"interval": "10s"}, "interval", "shorter than 30s", id="interval 10s"),
        pytest.param({"apply": {"maxConcurrent": 0}}, "apply.maxConcurrent", "≥ 1", id="conc 0"),
        pytest.param(
            {"selector": {"matchLabels": {"app": "we b"}}},
            "selector.matchLabels",
            "the value of 'app': 'we b' is not a label value",
            id="label value with a space",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]}},
            "selector.matchExpressions[0].values[0]",
            "'-x' is not a label value",
            id="set value starting with a dash",
        ),
        pytest.param(
            {"selector": {"matchLabels": {"-app": "web"}}},
            "selector.matchLabels",
            "'-app' is not a label key",
            id="label key",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
            "selector.matchExpressions[0].values",
            "In needs at least one value",
            id="In without values",
        ),
        pytest.param({"limits": {"bogus": 1}}, "limits.bogus", "min, max, maxStepUp", id="nested"),
        pytest.param({"limits": {"max": "0"}}, "limits.max", "positive", id="max 0"),
        pytest.param({"limits": {"max": "1Ki"}}, "limits.max", "not a CPU quantity", id="1Ki"),
        pytest.param({"headroom": "0.1"}, "headroom", "valid number", id="number as string"),
        pytest.param({"containers": ["api", "api"]}, "containers[1]", "twice", id="duplicate"),
        pytest.param({"containers": ["API"]}, "containers[0]", "container name", id="uppercase"),
        pytest.param(
            {"kinds": ["CronJob"]},
            "kinds[0]",
            "'CronJob' is not one of Deployment, StatefulSet, DaemonSet",
            id="kind CronJob",
        ),
        pytest.param(
            {"kinds": ["DaemonSet", "Deployment", "DaemonSet"]},
            "kinds[2]",
            "'DaemonSet' is listed twice",
            id="kind listed twice",
        ),
        pytest.param({"kinds": []}, "kinds", "list at least 1", id="no kinds"),
        pytest.param(
            {"kinds": ["statefulset"]}, "kinds[0]", "case-sensitive: 'StatefulSet'", id="kind case"
        ),
        pytest.param([], "spec", "must be an object", id="not an object"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field_and_the_fix(
    raw: object, field: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert says in str(caught.value)


def test_an_unknown_field_lists_the_fields_there_are() -> None:
    with pytest.raises(
        SpecError, match=r"the fields here are: selector, kinds, mode, .*, interval"
    ):
        parse_spec({"prometheusUrl": "x"})


# --- the engine's policy and the selector -------------------------------------------------


def test_the_engine_policy_carries_every_field() -> None:
    spec = parse_spec(
        {
            "targetThrottleRatio": 0.02,
            "headroom": 0.25,
            "strategy": "BurstPreferred",
            "limits": {"min": "250m", "max": "1500m", "maxStepUp": 3, "maxStepDown": 0.5},
            "processors": {"enabled": False},
        }
    )
    assert engine_policy(spec) == Policy(
        target_ratio=0.02,
        headroom=0.25,
        min_millicores=250,
        max_millicores=1500,
        max_step_up=3.0,
        max_step_down=0.5,
        strategy=Strategy.BURST_PREFERRED,
        sync_processors=False,
    )


@pytest.mark.parametrize("strategy", ["Auto", "BurstPreferred", "LimitOnly"])
def test_burst_disabled_means_limit_only_whatever_the_strategy(strategy: str) -> None:
    spec = parse_spec({"strategy": strategy, "burst": {"enabled": False}})
    assert engine_policy(spec).strategy is Strategy.LIMIT_ONLY


def test_the_spec_offers_exactly_the_engines_strategies() -> None:
    schema = ThrottlePolicySpec.model_json_schema()["properties"]["strategy"]
    assert set(schema["enum"]) == {s.value for s in Strategy}


WEB = {"app": "web", "tier": "front"}
BATCH = {"app": "batch", "tier": "back"}
BARE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("selector", "matching"),
    [
        ({}, {"web", "batch", "bare"}),
        ({"matchLabels": {"app": "web"}}, {"web"}),
        ({"matchLabels": {"app": "web", "tier": "back"}}, set()),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]},
         {"web", "batch"}),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]},
         {"batch", "bare"}),  # a missing label is "not in", as Kubernetes has it
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"web", "batch"}),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"bare"}),
        ({"matchLabels": {"tier": "back"},
          "matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"batch"}),
    ],
    ids=["empty", "matchLabels", "matchLabels all", "In", "NotIn", "Exists", "DoesNotExist",
         "both"],
)  # fmt: skip
def test_the_label_selector_matches_as_kubernetes_does(
    selector: dict[str, Any], matching: set[str]
) -> None:
    chosen = parse_spec({"selector": selector}).label_selector()
    objects = {"web": WEB, "batch": BATCH, "bare": BARE}
    assert {name for name, labels in objects.items() if chosen.matches(labels)} == matching


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("24h", 86400), ("7d", 604800), ("1w", 604800),
     ("1h30m", 5400), ("1w2d3h4m5s", 788645), ("0s", 0), ("366d", 366 * 86400)],
)  # fmt: skip
def test_durations_parse_in_go_and_prometheus_style(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "30", "0", "-5m", "+5m", "²d", "١٢h", "5 m", " 5m", "1.5h", "30m1h", "1h1h", "5ms",
     "367d", "53w", "1y", "9" * 40 + "s"],
)  # fmt: skip
def test_malformed_or_absurd_durations_are_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text)) + r".*e\.g\. 30s, 5m"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (90, "1m30s"), (3600, "1h"), (86400, "24h"), (172800, "48h"),
     (604800, "7d"), (612000, "7d2h"), (1209600, "14d")],
)  # fmt: skip
def test_durations_are_formatted_in_hours_below_a_week_and_days_from_a_week(
    seconds: int, text: str
) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=366 * 86400))
def test_formatting_a_duration_reads_back_exactly(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


# --- the status ----------------------------------------------------------------------------

STATUS_YAML = """
observedGeneration: 4
lastRun: "2026-12-01T10:00:00Z"
lastGoodRun: "2026-12-01T10:00:00Z"
summary: {deployments: 40, containers: 70, overTarget: 15, worstThrottleRatio: 0.41, leftOut: 0}
workloads:
- deployment: checkout
  kind: Deployment
  name: checkout
  state: Recommended
  message: "limit too low"
  containers:
  - name: api
    current:     {cpuLimit: "500m", cpuRequest: "100m", burst: "0ms", gomaxprocs: null}
    recommended: {cpuLimit: "900m", cpuLimitLowerBound: "610m", burst: "20ms", gomaxprocs: 2}
    throttleRatio: 0.41
    expectedThrottleRatio: 0.02
    expectedThrottleRatioRange: [0.02, 0.02]
    confidence: 0.93
    evidence: period
    reason: "throttled"
conditions:
- type: Ready
  status: "True"
  reason: Evaluated
  message: ""
  lastTransitionTime: "2026-12-01T10:00:00Z"
  observedGeneration: 4
"""


def test_the_status_dumps_exactly_in_the_issues_shape() -> None:
    raw = yaml.safe_load(STATUS_YAML)
    status = ThrottlePolicyStatus.model_validate(raw)
    assert status.model_dump(by_alias=True, exclude_none=False) == raw


def test_the_status_example_in_the_docs_is_a_valid_status() -> None:
    block = next(b for b in _yaml_blocks(DOC_FILE.read_text()) if "status" in b)
    status = ThrottlePolicyStatus.model_validate(block["status"])
    assert status.model_dump(by_alias=True) == block["status"]


# --- the CRD -------------------------------------------------------------------------------


def test_the_committed_crd_is_the_generated_one() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), (
        "crds/throttlepolicy.yaml is out of date; regenerate it with: "
        ".venv/bin/unthrottle crd > crds/throttlepolicy.yaml"
    )


def test_the_crd_names_the_resource_as_the_issue_does() -> None:
    definition = yaml.safe_load(CRD_FILE.read_text())
    spec = definition["spec"]
    assert definition["metadata"]["name"] == "throttlepolicies.unthrottle.io"
    assert (spec["group"], spec["scope"]) == ("unthrottle.io", "Namespaced")
    assert spec["names"] == {
        "kind": "ThrottlePolicy",
        "listKind": "ThrottlePolicyList",
        "plural": "throttlepolicies",
        "singular": "throttlepolicy",
        "shortNames": ["tpol"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Mode": ("string", ".spec.mode"),
        "Deployments": ("integer", ".status.summary.deployments"),
        "Over target": ("integer", ".status.summary.overTarget"),
        "Worst ratio": ("number", ".status.summary.worstThrottleRatio"),
        "Ready": ("string", '.status.conditions[?(@.type=="Ready")].status'),
        "Age": ("date", ".metadata.creationTimestamp"),
    }


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _nodes(node[key], f"{path}[]")


def test_the_schema_is_structural() -> None:
    for path, node in _nodes(_schema(), ""):
        assert "type" in node, f"{path}: no type"
        if "properties" in node:
            assert node["type"] == "object", path
            assert "additionalProperties" not in node, path
        for forbidden in ("$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "title", "const"):
            assert forbidden not in node, f"{path}: {forbidden}"
        assert node.get("type") != "null" and not isinstance(node.get("type"), list), path
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        assert node.get("default", ...) is not None, f"{path}: default null"
        for name, sub in node.get("properties", {}).items():
            if f"{path}.{name}".startswith(".metadata"):  # the API server allows only type
                continue  # and name rules there: a description refused the whole CRD
            assert sub.get("description"), f"{path}.{name}: no description"
        for flag in ("exclusiveMinimum", "exclusiveMaximum"):  # OpenAPI v3.0 spells them so
            assert isinstance(node.get(flag, False), bool), f"{path}: {flag} is not a flag"


def test_limits_are_compared_as_quantities_by_the_api_server() -> None:
    limits = _spec_field("limits")
    rules = [r["rule"] for r in limits["x-kubernetes-validations"]]
    assert any("quantity(self.min).compareTo(quantity(self.max)) <= 0" in r for r in rules)
    for bound in ("min", "max"):
        (rule,) = limits["properties"][bound]["x-kubernetes-validations"]
        assert "isQuantity(self)" in rule["rule"]


def test_the_crd_pattern_for_durations_agrees_with_parse_duration() -> None:
    window = _spec_field("window")
    for text in ["30s", "1h30m", "7d", "1w2d3h4m5s", "", "30", "5ms", "30m1h", "²d"]:
        by_schema = bool(re.fullmatch(window["pattern"], text)) and len(text) >= 2
        try:
            parse_duration(text)
            parsed = True
        except ValueError:
            parsed = False
        assert by_schema == parsed, text


def test_unthrottle_crd_prints_the_committed_file() -> None:
    result = CliRunner().invoke(app, ["crd"])
    assert result.exit_code == 0, result.output
    assert result.stdout == CRD_FILE.read_text()


def test_the_schema_of_metadata_holds_only_what_the_api_server_allows() -> None:
    metadata = _schema()["properties"]["metadata"]
    assert set(metadata) <= {"type", "properties"} and metadata["type"] == "object"
    assert set(metadata.get("properties", {})) <= {"name", "generateName"}


def test_the_api_server_accepts_the_crd(control_plane: ControlPlane) -> None:
    """A server-side dry run with the control plane's own kubectl: the real kube-apiserver
    validates the whole CRD, its structural schema and its CEL rules (the CRD of
    2026-11-30 was refused twice here), and stores nothing."""
    done = subprocess.run(
        [str(control_plane.bin("kubectl")), "--kubeconfig", str(control_plane.kubeconfig),
         "apply", "--dry-run=server", "-o", "yaml", "-f", str(CRD_FILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["metadata"]["name"] == "throttlepolicies.unthrottle.io"


# --- the reference doc ---------------------------------------------------------------------


@pytest.mark.parametrize("doc", [DOC_FILE, ROOT / "docs" / "using.md"], ids=["docs", "using"])
def test_the_reference_tables_in_the_docs_are_the_generated_ones(doc: Path) -> None:
    text = doc.read_text()
    name = doc.relative_to(ROOT)
    assert "<!-- spec-reference:start -->\n" + spec_reference_markdown() in text
    assert with_reference_tables(text) == text, (
        f"{name}'s tables are out of date; regenerate them with: "
        ".venv/bin/python -c 'import pathlib, unthrottle.model.crd as c; "
        f'p = pathlib.Path("{name}"); p.write_text(c.with_reference_tables('
        "p.read_text()))'"
    )


def test_the_reference_lists_every_spec_field_with_its_default() -> None:
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[3].strip()
        for line in spec_reference_markdown().splitlines()[2:]
    }
    assert rows["window"] == '`"24h"`' and rows["limits.max"] == '`"8"`'
    assert rows["apply.gitOps"] == '`"Skip"`' and rows["targetThrottleRatio"] == "`0.05`"
    assert "selector.matchExpressions[].operator" in rows
    assert rows["apply.method"] == '`"Rollout"`'
    assert rows["kinds"] == '`["Deployment"]`'
    assert len(rows) == 31
