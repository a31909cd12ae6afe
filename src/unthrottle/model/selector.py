"""Kubernetes label selectors (``app=web,tier!=batch,env in (prod,staging),!legacy``).

The syntax of ``kubectl get -l``: requirements joined by commas, each one of
``key``, ``!key``, ``key=value`` (or ``==``), ``key!=value``, ``key in (a,b)``
and ``key notin (a,b)``. Matching is done here rather than by the API server,
so a selection means the same with cluster access and with kube-state-metrics
alone (whose ``kube_deployment_labels`` spells ``app.kubernetes.io/name`` as
``label_app_kubernetes_io_name``: :meth:`Selector.matches_exported`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
_PART = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[^\s!=,()]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?"
    r"\s*(?:,|$)"
)
_EXPORTED = re.compile(r"[^A-Za-z0-9_]")


class SelectorError(ValueError):
    """A selector that does not parse; the message quotes the part at fault."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement: ``op`` is ``exists``, ``!exists``, ``in`` or ``notin``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str], key: str | None = None) -> bool:
        value = labels.get(self.key if key is None else key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op == "in":
            return value is not None and value in self.values
        return value is None or value not in self.values  # notin, as Kubernetes defines it

    def text(self) -> str:
        """The requirement in ``kubectl -l`` syntax."""
        if self.op == "exists":
            return self.key
        if self.op == "!exists":
            return f"!{self.key}"
        values = sorted(self.values)
        if len(values) == 1:
            return f"{self.key}{'=' if self.op == 'in' else '!='}{values[0]}"
        return f"{self.key} {self.op} ({','.join(values)})"


@dataclass(frozen=True, slots=True)
class Selector:
    """All requirements must hold; an empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """Do an object's labels satisfy every requirement?"""
        return all(r.matches(labels) for r in self.requirements)

    def text(self) -> str:
        """The selector in ``kubectl -l`` syntax (parses back to the same selector)."""
        return ",".join(r.text() for r in self.requirements)

    def matches_exported(self, series_labels: dict[str, str]) -> bool:
        """The same, for kube-state-metrics' ``label_<key>`` series labels."""
        labels = {k[6:]: v for k, v in series_labels.items() if k.startswith("label_")}
        return all(r.matches(labels, exported_key(r.key)) for r in self.requirements)


def exported_key(key: str) -> str:
    """How kube-state-metrics names a Kubernetes label key (after its ``label_`` prefix)."""
    return _EXPORTED.sub("_", key)


def _checked(part: str, key: str, values: list[str]) -> None:
    if not _KEY.match(key):
        raise SelectorError(f"{part!r}: {key!r} is not a label key")
    for value in values:
        if not _VALUE.match(value):
            raise SelectorError(f"{part!r}: {value!r} is not a label value")


def parse_selector(text: str) -> Selector:
    """Parse a label selector; :class:`SelectorError` names the part that does not."""
    requirements: list[Requirement] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        found = _PART.match(text, pos)
        if found is None or found.end() == pos:
            rest = text[pos:].strip()
            raise SelectorError(f"{rest!r} is not a requirement (key, !key, key=value, "
                                "key!=value, key in (a,b) or key notin (a,b))")  # fmt: skip
        part = found.group(0).strip().rstrip(",").strip()
        key, op = found.group("key"), found.group("op")
        if found.group("neg"):
            if op or found.group("set"):
                raise SelectorError(f"{part!r}: '!' goes only before a bare key")
            _checked(part, key, [])
            requirements.append(Requirement(key, "!exists"))
        elif op:
            value = found.group("value")
            _checked(part, key, [value])
            requirements.append(Requirement(key, "notin" if op == "!=" else "in",
                                            frozenset({value})))  # fmt: skip
        elif found.group("set"):
            values = [v.strip() for v in found.group("values").split(",")]
            if not any(values):
                raise SelectorError(f"{part!r}: a set needs at least one value")
            _checked(part, key, values)
            requirements.append(Requirement(key, found.group("set"), frozenset(values)))
        else:
            _checked(part, key, [])
            requirements.append(Requirement(key, "exists"))
        pos = found.end()
    return Selector(tuple(requirements))
