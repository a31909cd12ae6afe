"""The product ships alone: the wheel and the image hold src/unthrottle and nothing of the
laboratory (lab/src/unthrottle_lab), and the product's command lists only the product's
commands. DESIGN.md §6, STYLE.md rule 18."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "lab" / "src" / "unthrottle_lab"
LAB_COMMANDS = ("run", "workload", "tune", "simulate", "lab")
PRODUCT_COMMANDS = ("recommend", "prometheus-rules", "operator", "crd", "report", "agent")


def _local_backend() -> bool:
    """Whether this environment can build a wheel itself: setuptools 70.1 or later (which
    has bdist_wheel), or an older one with the ``wheel`` package."""
    try:
        version = tuple(int(v) for v in metadata.version("setuptools").split(".")[:2])
    except metadata.PackageNotFoundError:
        return False
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product's wheel, built from this checkout as the image's build stage builds it
    (``pip wheel .``), less the dependencies; with the build backend this environment has
    when it has one, so no package registry is needed."""
    out = tmp_path_factory.mktemp("wheel")
    # what the Dockerfile's build stage copies, and nothing else (no stale build/ folder)
    context = tmp_path_factory.mktemp("context")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, context / name)
    shutil.copytree(
        ROOT / "src", context / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    isolation = ["--no-build-isolation"] if _local_backend() else []
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation,
         "--disable-pip-version-check", "--wheel-dir", str(out), str(context)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    offline = r"Could not find a version|NewConnectionError|Max retries|Temporary failure"
    if done.returncode != 0 and re.search(offline, done.stderr):
        pytest.skip(f"PyPI unreachable for the build backend: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("unthrottle-*.whl")
    return built


def _modules(wheel: Path) -> dict[str, str]:
    """Dotted module name → source, for every .py in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name.removesuffix(".py").removesuffix("/__init__").replace("/", "."):
                archive.read(name).decode()
            for name in archive.namelist() if name.endswith(".py")
        }  # fmt: skip


def test_the_wheel_holds_the_product_and_no_module_of_the_laboratory(wheel: Path) -> None:
    modules = _modules(wheel)
    assert modules and all(m == "unthrottle" or m.startswith("unthrottle.") for m in modules)
    lab = {p.relative_to(LAB.parent).with_suffix("").as_posix().replace("/", ".")
           for p in LAB.rglob("*.py")}  # fmt: skip
    assert "unthrottle_lab.kube.build" in lab  # the comparison has teeth
    assert not {m for m in modules if m.startswith("unthrottle_lab")} & lab
    # what the laboratory took from the product's old layout is not back in it
    moved = ("unthrottle.lab", "unthrottle.devtools", "unthrottle.cfs.tasks",
             "unthrottle.model.scenario", "unthrottle.cli.output")  # fmt: skip
    assert not [m for m in modules if m.startswith(moved)]


def test_no_module_of_the_wheel_imports_the_laboratory(wheel: Path) -> None:
    importers = []
    for name, source in _modules(wheel).items():
        for node in ast.walk(ast.parse(source)):
            found = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            if any(f.split(".")[0] == "unthrottle_lab" for f in found):
                importers.append(name)
    assert importers == []


def test_the_products_command_lists_only_the_products_commands(wheel: Path, tmp_path: Path) -> None:
    """``unthrottle --help`` from the wheel alone, with the laboratory made unimportable
    (this environment has it installed for development)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    code = (
        "import sys\n"
        "class NoLab:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'unthrottle_lab':\n"
        "            raise ImportError('the laboratory is not installed')\n"
        "sys.meta_path.insert(0, NoLab())\n"
        f"sys.path.insert(0, {str(tmp_path / 'site')!r})\n"
        "import unthrottle.cli.main as m\n"
        "assert m.__file__.startswith(sys.path[0]), m.__file__\n"
        "sys.argv = ['unthrottle', '--help']\n"
        "m.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^│ (\S+)", done.stdout.split("Commands")[1], re.M))
    assert listed == set(PRODUCT_COMMANDS), done.stdout
    assert not listed & set(LAB_COMMANDS)


def test_the_image_copies_only_the_product() -> None:
    """The Dockerfile's build stage copies the project table, its readme and src/ (the
    product's source root) and nothing of lab/; .dockerignore lets in src/unthrottle only."""
    copies = [line.split()[1:-1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line]  # fmt: skip
    assert sorted(s for c in copies for s in c) == ["README.md", "pyproject.toml", "src"]
    allowed = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]  # fmt: skip
    assert allowed == ["!pyproject.toml", "!README.md", "!src/unthrottle/"]
