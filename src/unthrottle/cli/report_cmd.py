"""``unthrottle report``: an operator-managed policy's latest report, from its ConfigMap.

Also what ``recommend`` and ``report`` share about output: the ``--format`` check and
writing text (a file, or stdout) or a directory of files (kustomize).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from unthrottle.cli import checks
from unthrottle.cli.common import describe_kube_error, fail, load_kube_config, note
from unthrottle.report import DIRECTORY_FORMATS, FORMATS, Output, RenderOptions, Report, render
from unthrottle.report.kustomize import MARKER
from unthrottle.report.model import ReportError

GROUP, VERSION, PLURAL = "unthrottle.io", "v1alpha1", "throttlepolicies"
TIMEOUT_S = 30
REPORT_FORMATS = ("markdown", "html", "json", "kustomize")
"""What ``report`` offers first (every registered format works)."""


def check_format(fmt: str, output: Path | None) -> None:
    """Exit 2 for an unknown format, or a directory format without ``--output``."""
    if fmt not in FORMATS:
        names = ", ".join(FORMATS)
        raise fail(f"--format: {fmt!r} is not one of {names}", 2)
    if fmt in DIRECTORY_FORMATS and output is None:
        raise fail(f"--format {fmt} writes a directory: name it with --output DIR", 2)


def terminal_options() -> RenderOptions:
    """The table as wide as the terminal when there is one (never narrower than 120)."""
    width = max(120, shutil.get_terminal_size((200, 24)).columns) if sys.stdout.isatty() else 200
    return RenderOptions(width=width)


def _write_atomically(path: Path, text: str) -> None:
    """``path`` holds the old text or the new, never half of it; a device (/dev/stdout, a
    FIFO) is written in place."""
    if path.exists() and not path.is_file():
        path.write_text(text)
        return
    target = path.resolve() if path.is_symlink() else path
    mode = target.stat().st_mode & 0o7777 if target.exists() else None
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        if mode is None:  # a new file: what open() would give it under this umask
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_files(files: dict[str, str], folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise fail(f"--output: {folder} is a file; a directory format needs a directory", 2)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.yaml"):  # patches of an earlier run: only ours are removed
        if old.name not in files and old.read_text().startswith(MARKER):
            old.unlink()
    for name, text in files.items():
        _write_atomically(folder / name, text)
    note(f"wrote {folder / 'kustomization.yaml'} and {len(files) - 1} patches")


def write_output(output: Output, path: Path | None) -> None:
    """Text to ``path`` (atomically) or stdout; files into the directory ``path``."""
    if path is None:
        assert not isinstance(output, dict)  # check_format asked for a path
        sys.stdout.write(output)
        return
    try:
        if isinstance(output, dict):
            _write_files(output, path)
        else:
            _write_atomically(path, output)
    except OSError as error:
        raise fail(
            f"--output: cannot write {error.filename or path}: {error.strerror}", 1
        ) from None


def _context_namespace() -> str:
    """The kubeconfig context's namespace, as kubectl defaults to it."""
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str((active or {}).get("context", {}).get("namespace") or "default")
    except Exception:  # in-cluster, or no kubeconfig: kubectl's default too
        return "default"


def _missing(custom: Any, namespace: str, policy: str) -> typer.Exit:
    """The ConfigMap is not there: say whether the policy is."""
    from kubernetes.client.exceptions import ApiException

    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, policy,
                                            _request_timeout=TIMEOUT_S)  # fmt: skip
    except ApiException as error:
        if error.status == 404:
            return fail(f"no ThrottlePolicy {namespace}/{policy} (kubectl get throttlepolicies "
                        f"-n {namespace} lists them)", 1)  # fmt: skip
    except Exception:
        pass  # the ConfigMap's absence is the answer either way
    return fail(f"ThrottlePolicy {namespace}/{policy} has no report yet: the operator writes "
                f"ConfigMap {policy}-report after its first run (kubectl describe "
                f"throttlepolicy {policy} -n {namespace} shows why it has not)", 1)  # fmt: skip


def read_report(core: Any, custom: Any, namespace: str, policy: str) -> Report:
    """The policy's report from its ConfigMap ``<policy>-report``; exits with a message
    when it cannot be had."""
    from kubernetes.client.exceptions import ApiException

    name = f"{policy}-report"
    try:
        cm = core.read_namespaced_config_map(name, namespace, _request_timeout=TIMEOUT_S)
    except ApiException as error:
        if error.status == 404:
            raise _missing(custom, namespace, policy) from None
        raise fail(f"cannot read ConfigMap {namespace}/{name}: "
                   f"{describe_kube_error(error)}", 1) from None  # fmt: skip
    except Exception as error:  # urllib3's connection errors
        raise fail(f"cannot read ConfigMap {namespace}/{name}: "
                   f"{describe_kube_error(error, TIMEOUT_S)}", 1) from None  # fmt: skip
    text = (cm.data or {}).get("report.json")
    if text is None:
        raise fail(f"ConfigMap {namespace}/{name} has no report.json: not an unthrottle report", 1)
    try:
        return Report.from_json(json.loads(text))
    except (json.JSONDecodeError, ReportError) as error:
        raise fail(f"ConfigMap {namespace}/{name}: report.json: {error}", 1) from None


def report_command(
    policy: Annotated[str, typer.Argument(help="The ThrottlePolicy.", show_default=False)],
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="Its namespace (default: the kubeconfig context's)."
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="markdown, html, json or kustomize (a directory).")
    ] = "markdown",
    output: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig (default: in-cluster, else $KUBECONFIG or ~/.kube/config)."),
    ] = None,
) -> None:
    """Render a policy's latest report (its ConfigMap) as Markdown, HTML, JSON or kustomize."""
    check_format(fmt, output)
    checks.object_name(policy, "POLICY", "ThrottlePolicy")
    if namespace is not None:
        checks.names([namespace], "--namespace")
    checks.output_path(output, directory=fmt in DIRECTORY_FORMATS)
    load_kube_config(kubeconfig)
    from kubernetes import client

    ns = namespace or _context_namespace()
    report = read_report(client.CoreV1Api(), client.CustomObjectsApi(), ns, policy)
    if report.truncated is not None:
        t = report.truncated
        note(
            f"the report holds the {t.shown} most harmful Deployments; {t.left_out} more "
            "were left out to fit its ConfigMap (unthrottle recommend covers them all)"
        )
    write_output(render(report, fmt, terminal_options()), output)
