"""Options checked before any work: each bad one exits 2 with one line naming the flag.

One validation layer at the edge. Typer has already turned the text into the option's
type; these say whether the value makes sense (a number finite and in its range, a
duration in the Prometheus spelling, a name Kubernetes could have, a path that can be
written) and name the flag the user typed, not the model's field.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from unthrottle.cli.common import fail
from unthrottle.model.durations import parse_duration
from unthrottle.units import MAX_PERIOD_US, MIN_PERIOD_US

if TYPE_CHECKING:
    from unthrottle.agent.burst import BurstScope

_PERIOD = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.ASCII)
_PERIOD_UNIT_US = {"us": 1, "ms": 1000, "s": 1_000_000}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def number(value: float, option: str, low: float, high: float, unit: str = "") -> float:
    """``value`` if it is finite and within [low, high], else exit 2 naming ``option``."""
    if not low <= value <= high:  # also refuses NaN
        shown = f"{value:g}" if math.isfinite(value) or math.isinf(value) else "nan"
        raise fail(f"{option}: {shown}{unit} is not a number from {low:g} to {high:g}{unit}", 2)
    return value


def whole(value: int | None, option: str, low: int, high: int | None = None,
          why: str = "") -> int | None:  # fmt: skip
    """``value`` (or None) if within [low, high], else exit 2 naming ``option``."""
    if value is not None and not (low <= value and (high is None or value <= high)):
        bounds = f"at least {low}" if high is None else f"from {low} to {high:,}"
        raise fail(f"{option}: {value} is not {bounds}{why}", 2)
    return value


def duration(text: str, option: str, *, at_least_s: int = 1) -> int:
    """A Prometheus-style duration (``7d``, ``1h30m``) in seconds, at least ``at_least_s``."""
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise fail(f"{option}: {error}", 2) from None
    if seconds < at_least_s:
        raise fail(f"{option}: {text!r} is shorter than {at_least_s} s", 2)
    return seconds


def cfs_period(text: str, option: str) -> int:
    """A CFS period as the kubelet's ``--cpu-cfs-quota-period`` takes it (``100ms``,
    ``50ms``, ``1s``, ``2500us``), in whole µs within the kernel's 1 ms … 1 s."""
    found = _PERIOD.match(text)
    if found is None:
        raise fail(f"{option}: {text!r} is not a period such as 100ms, 50ms or 1s", 2)
    micros = float(found.group(1)) * _PERIOD_UNIT_US[found.group(2)]
    if not MIN_PERIOD_US <= micros <= MAX_PERIOD_US:
        raise fail(f"{option}: {text} is outside the kernel's range of 1ms to 1s", 2)
    if not micros.is_integer():
        raise fail(f"{option}: {text} is not a whole number of microseconds", 2)
    return int(micros)


def names(values: list[str] | None, option: str, what: str = "namespace") -> tuple[str, ...]:
    """Namespace (DNS-1123 label) names, checked: a name Kubernetes cannot have is a typo."""
    for value in values or ():
        if not _DNS_LABEL.match(value):
            raise fail(f"{option}: {value!r} is not a {what} name (lowercase letters, digits "
                       "and '-', at most 63)", 2)  # fmt: skip
    return tuple(values or ())


def object_name(value: str, option: str, what: str) -> str:
    """An object's name (DNS-1123 subdomain), checked."""
    if not _DNS_SUBDOMAIN.match(value):
        raise fail(f"{option}: {value!r} is not a {what} name (lowercase letters, digits, "
                   "'-' and '.', at most 253)", 2)  # fmt: skip
    return value


def _probe(folder: Path, path: Path) -> None:
    """A file can be created in ``folder`` (one is, then removed), else exit 2."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".unthrottle-", suffix=".probe"):
            pass
    except OSError as error:
        raise fail(f"--output: cannot write {path}: no file can be made in {folder} "
                   f"({error.strerror})", 2) from None  # fmt: skip


def output_path(path: Path | None, *, directory: bool) -> None:
    """``--output`` can be written, checked before any query: a file in an existing,
    writable directory (or a device such as /dev/stdout), or a directory that exists or
    can be made."""
    if path is None:
        return
    if directory:
        if path.exists() and not path.is_dir():
            raise fail(f"--output: {path} is a file; a directory format needs a directory", 2)
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise fail(f"--output: {existing} is not a directory", 2)
        _probe(existing, path)
    elif path.is_dir():
        raise fail(f"--output: {path} is a directory; name a file", 2)
    elif path.exists() and not path.is_file():  # /dev/stdout, a FIFO: written in place
        if not os.access(path, os.W_OK):
            raise fail(f"--output: {path} is not writable", 2)
    elif not path.parent.is_dir():
        raise fail(f"--output: {path.parent} is not a directory that exists", 2)
    else:
        _probe(path.parent, path)


def listen_address(value: str, option: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free one), else exit 2 naming ``option``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise fail(f"{option}: {value!r} is not HOST:PORT (e.g. 0.0.0.0:9717)", 2)
    return host.strip("[]"), int(port)


def agent_options(*, standalone: bool, cgroup_root: str, kubeconfig: Path | None,
                  listen: str) -> None:  # fmt: skip
    """The agent's options checked before it starts: ``--listen``, a ``--kubeconfig``
    that standalone mode would ignore, and a ``--cgroup-root`` that is not a cgroup (a
    typo must not look like an idle node)."""
    listen_address(listen)
    if standalone and kubeconfig is not None:
        raise fail("--kubeconfig and --standalone: standalone mode does not use the "
                   "Kubernetes API; give one or the other", 2)  # fmt: skip
    if not standalone:
        return
    from unthrottle.agent.discovery import NotFound, cgroup_dir
    from unthrottle.cgroups import CgroupError, detect_layout

    try:
        layout = detect_layout()
    except CgroupError:
        return  # the agent itself says so, as an environment error
    try:
        cgroup_dir(layout, cgroup_root, what="cgroup root")
    except NotFound as error:
        raise fail(f"--cgroup-root: {error}", 2) from None


def burst_scope(*, burst: bool, namespaces: list[str], koordinator: bool,
                standalone: bool) -> BurstScope | None:  # fmt: skip
    """The burst writer's allowlist from ``--burst``, ``--burst-namespace`` and
    ``--burst-koordinator``; None when the agent only measures. Writing is opt-in, and
    so is each namespace whose pods may ask for it."""
    from unthrottle.agent.burst import ALL_NAMESPACES, BurstScope

    if not burst:
        if namespaces or koordinator:
            flag = "--burst-namespace" if namespaces else "--burst-koordinator"
            raise fail(f"{flag} without --burst: the agent writes no burst unless --burst "
                       "is given", 2)  # fmt: skip
        return None
    if standalone:
        raise fail("--burst and --standalone: burst is asked for by pod annotations, "
                   "which standalone mode does not read", 2)  # fmt: skip
    if not namespaces:
        raise fail("--burst needs --burst-namespace: name each namespace whose pods may ask "
                   f"for burst (repeat it), or {ALL_NAMESPACES} for every namespace but "
                   "kube-system", 2)  # fmt: skip
    for name in namespaces:
        if name != ALL_NAMESPACES and not _DNS_LABEL.match(name):
            raise fail(f"--burst-namespace: {name!r} is not a namespace name", 2)
    return BurstScope(namespaces=frozenset(namespaces), koordinator=koordinator)
