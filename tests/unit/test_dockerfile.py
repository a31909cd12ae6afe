"""The image (Dockerfile): linted by hadolint, and held to pyproject.toml.

No container engine runs on these machines, so these unit tests do not build the image
(tests/kernel/test_image.py builds it with buildah on a stand-in base, and runs it on the
real node). What is checked here is: hadolint's rules, with no finding allowed; that the
image installs the very package and extras the tests install, from the project itself (not
a dependency list that could drift from pyproject.toml); that the build context
.dockerignore leaves is enough to build the wheel (it is built from exactly that context);
that both stages start from the official python image unless a build arg says otherwise;
and what the last stage holds.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from missing import MISSING
from support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).with_name("hadolint")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OCI_LABELS = ["title:text", "description:text", "version:semver", "licenses:spdx"]


@dataclass
class Stage:
    """One FROM … section: its base image, name, and instructions (keyword, argument)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arg = (pending + line).partition(" ")
        out.append((keyword.upper(), arg.strip()))
        pending = ""
    return out


def substituted(text: str, args: dict[str, str]) -> str:
    """``text`` with each ``${NAME}`` of an ARG defined before it replaced by its value."""
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def parse_dockerfile() -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults (an ARG's default may use the ARGs above it, as
    ``BASE_IMAGE`` does), and the stages with their ARGs substituted in FROM."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, arg in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            words = arg.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(substituted(words[0], args), name))
        elif keyword == "ARG" and not stages:
            key, _, value = arg.partition("=")
            args[key] = substituted(value, args)
        elif stages:
            stages[-1].instructions.append((keyword, arg))
    return args, stages


def run_commands(stage: Stage) -> list[list[str]]:
    """Each shell command of the stage's RUN instructions, split into words."""
    commands = []
    for run in stage.all("RUN"):
        for part in re.split(r"&&|;", run):
            if part.strip():
                commands.append(shlex.split(part))
    return commands


def pip_installs(stage: Stage) -> list[list[str]]:
    """The positional arguments (what is installed) of every pip install / pip wheel."""
    found = []
    for words in run_commands(stage):
        names = [Path(w).name for w in words[:3]]
        if "pip" in names and ({"install", "wheel"} & set(words)):
            verb = next(i for i, w in enumerate(words) if w in ("install", "wheel"))
            rest, positional, skip = words[verb + 1 :], [], False
            for word in rest:
                if skip:
                    skip = False
                elif word in ("--wheel-dir", "-w", "--find-links", "-f", "--target", "-t"):
                    skip = True
                elif not word.startswith("-"):
                    positional.append(word)
            found.append(positional)
    return found


def split_extras(spec: str) -> tuple[str, set[str]]:
    match = re.fullmatch(r"(.+?)(?:\[([^\]]*)\])?", spec.strip("'\""))
    assert match is not None
    return match.group(1), {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}


def test_hadolint_finds_nothing_and_requires_the_oci_labels() -> None:
    labels = [f"--require-label=org.opencontainers.image.{label}" for label in OCI_LABELS]
    out = subprocess.run([str(HADOLINT), "--format=json", "--failure-threshold=style",
                          "--disable-ignore-pragma", *labels, str(DOCKERFILE)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    findings = json.loads(out.stdout or "[]")
    assert findings == [] and out.returncode == 0, findings or out.stderr


def test_hadolint_does_lint(tmp_path: Path) -> None:
    """A careless Dockerfile fails the same check: the lint above is not a no-op."""
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN pip install unthrottle\n")
    out = subprocess.run([str(HADOLINT), "--format=json", str(careless)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert {"DL3006", "DL3013", "DL3042"} <= codes and out.returncode != 0


def test_the_image_installs_the_package_and_extras_the_tests_install() -> None:
    """The Makefile installs `.[test]` for the tests; the image installs the same project
    from its own source, with the same extras except the test-only `test`: never a list
    of dependencies of its own that could drift from pyproject.toml."""
    make = re.search(r"pip install [^\n]*-e '([^']+)'", (ROOT / "Makefile").read_text())
    assert make is not None, "the Makefile's install line was not found"
    tested_package, tested_extras = split_extras(make.group(1))
    assert tested_package == "."
    _, stages = parse_dockerfile()
    build, final = stages[0], stages[-1]
    installs = pip_installs(build)
    assert installs, "the build stage installs nothing with pip"
    specs = [spec for positional in installs for spec in positional]
    (source,) = [s for s in specs if not s.startswith("/wheels/")]
    package, extras = split_extras(source)
    assert (build.all("WORKDIR")[-1], package) == ("/src", ".")  # the copied project
    assert extras == tested_extras - {"test"}
    assert extras <= set(PROJECT["project"].get("optional-dependencies", {}))
    wheels = [s for s in specs if s.startswith("/wheels/")]
    assert wheels == [f"/wheels/{PROJECT['project']['name']}-*.whl"]
    assert pip_installs(final) == []  # nothing is resolved again in the last stage


def test_the_build_copies_what_the_build_backend_reads() -> None:
    setuptools = PROJECT["tool"]["setuptools"]["packages"]["find"]
    needed = {"pyproject.toml", PROJECT["project"]["readme"], *setuptools["where"]}
    license_file = PROJECT["project"].get("license", {}).get("file")
    if license_file:
        needed.add(license_file)
    _, stages = parse_dockerfile()
    copied = set()
    for arg in stages[0].all("COPY"):
        *sources, _ = arg.split()
        copied |= {s.rstrip("/") for s in sources if not s.startswith("--")}
    assert copied == needed


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` (relative, with /) out of the context: the last
    matching pattern wins, ``!`` lets back in, and a pattern matching a parent matches
    what is below it (as BuildKit's pattern matcher does)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.rstrip("/").replace("**/", "*/")
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            ignored = not negate
    return ignored


def build_context(target: Path) -> list[str]:
    """Copy the Docker build context (the repository less .dockerignore) to ``target``."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    kept = []
    for top in sorted(ROOT.iterdir()):
        if dockerignored(top.name, patterns) and not any(
            p.startswith(f"!{top.name}") for p in patterns
        ):
            continue  # a whole tree left out (.venv, .git): not walked
        for path in [top, *top.rglob("*")] if top.is_dir() else [top]:
            relative = path.relative_to(ROOT).as_posix()
            if path.is_file() and not dockerignored(relative, patterns):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / relative)
                kept.append(relative)
    return kept


def test_the_wheel_builds_from_exactly_the_docker_build_context(tmp_path: Path) -> None:
    context = tmp_path / "context"
    kept = build_context(context)
    assert "Dockerfile" not in kept and not [k for k in kept if "__pycache__" in k]
    _, stages = parse_dockerfile()
    for arg in stages[0].all("COPY"):  # Docker fails a COPY of what the context lacks
        for source in arg.split()[:-1]:
            assert (context / source).exists(), f"COPY {source}: left out by .dockerignore"
    assert not [k for k in kept if k.startswith(("tests/", "docs/", "charts/", ".venv/"))]
    # As the build stage does (`pip wheel .`: the build backend from PyPI, in isolation),
    # less the dependencies, which do not read the context.
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                          "--disable-pip-version-check", "--wheel-dir", str(tmp_path / "wheels"),
                          str(context)], capture_output=True, text=True, check=False)  # fmt: skip
    offline = r"Could not find a version|NewConnectionError|Max retries|Temporary failure"
    if out.returncode != 0 and re.search(offline, out.stderr):
        pytest.skip(f"{MISSING} PyPI, for the build backend: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "wheels").glob(f"{PROJECT['project']['name']}-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = ROOT / "src"
    modules = {p.relative_to(source).as_posix() for p in source.rglob("unthrottle/**/*.py")}
    assert modules and modules <= names, sorted(modules - names)[:5]
    assert "unthrottle/py.typed" in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    readme = "Description-Content-Type: text/markdown"  # the readme was in the context
    assert readme in zipfile.ZipFile(wheel).read(metadata).decode()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert f"unthrottle = {PROJECT['project']['scripts']['unthrottle']}" in scripts


def test_both_stages_run_the_python_the_project_is_tested_on() -> None:
    _, stages = parse_dockerfile()
    assert len(stages) == 2 and stages[0].name == "build"
    bases = {stage.base for stage in stages}
    assert len(bases) == 1, bases  # the virtualenv is copied: the same interpreter in both
    # a digest may follow (--build-arg PYTHON_DIGEST=@sha256:…, docs/install.md)
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-(\w+)(?:@sha256:[0-9a-f]{64})?",
                         bases.pop())  # fmt: skip
    assert match is not None, "pin the base image to python:X.Y.Z-slim-<debian>"
    major, minor, _ = (int(g) for g in match.groups()[:3])
    low = re.fullmatch(r">=(\d+)\.(\d+)", PROJECT["project"]["requires-python"])
    assert low is not None and (major, minor) >= (int(low[1]), int(low[2]))
    assert f"{major}.{minor}" == PROJECT["tool"]["mypy"]["python_version"]


def test_the_base_is_the_official_python_image_unless_a_build_arg_says_otherwise() -> None:
    """Both stages start from ``BASE_IMAGE``, whose default is the official
    ``python:<version>-slim-bookworm``: what users build and what the chart runs. Only the
    laboratory, which can pull no image, passes its stand-in (``make image``)."""
    args, _ = parse_dockerfile()
    froms = [arg.split()[0] for kw, arg in instructions(DOCKERFILE.read_text()) if kw == "FROM"]
    assert froms == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert args["BASE_IMAGE"] == f"python:{args['PYTHON_VERSION']}-slim-bookworm"
    assert args["PYTHON_DIGEST"] == ""  # unpinned by default: docs/install.md pins it


def test_the_last_stage_holds_no_compiler_no_pip_cache_no_source_and_runs_as_a_user() -> None:
    _, stages = parse_dockerfile()
    build, final = stages
    copies = final.all("COPY")
    assert copies == ["--from=build /opt/unthrottle /opt/unthrottle"]  # only the virtualenv
    words = [w for command in run_commands(final) for w in command]
    assert not {"apt-get", "apt", "gcc", "pip", "pip3"} & {Path(w).name for w in words}
    env = " ".join(build.all("ENV"))
    assert "PIP_NO_CACHE_DIR=1" in env  # the build stage caches nothing either
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or gid.isdigit())  # runAsNonRoot
    assert final.all("ENTRYPOINT") == ['["unthrottle"]']
    assert "unthrottle" in PROJECT["project"]["scripts"]


def test_the_labels_say_what_pyproject_says() -> None:
    _, stages = parse_dockerfile()
    labels = dict(
        (key, value.strip('"'))
        for arg in stages[-1].all("LABEL")
        for key, value in re.findall(r'(\S+)=("[^"]*"|\S+)', arg)
    )
    project = PROJECT["project"]
    assert labels == {
        "org.opencontainers.image.title": project["name"],
        "org.opencontainers.image.description": project["description"],
        "org.opencontainers.image.version": project["version"],
        "org.opencontainers.image.licenses": project["license"]["text"],
    }


@pytest.mark.parametrize(
    ("path", "left_out"),
    [("src/unthrottle/cli/main.py", False), ("pyproject.toml", False),
     ("src/unthrottle/__pycache__/x.pyc", True), (".venv/bin/python", True),
     ("tests/servers/test_chart.py", True), ("src/unthrottle.egg-info/PKG-INFO", True)],
)  # fmt: skip
def test_the_dockerignore_matcher_reads_patterns_as_docker_does(path: str, left_out: bool) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert dockerignored(path, patterns) is left_out
