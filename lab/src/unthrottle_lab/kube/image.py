"""The product's image, built here from the project's Dockerfile, for the real node.

No base image can be pulled on these machines and there is no Docker engine, so Debian's
buildah builds the Dockerfile as it is, with one build arg: ``BASE_IMAGE``, a stand-in for
the official ``python:3.11-slim-bookworm`` that mmdebstrap makes from Debian's packages
(Debian's Python 3.11, linked where the official image has its own). Everything else, both
stages, pip resolving the dependencies from pyproject.toml, the user 10001, is what users
build. The result is a docker-archive tar, imported with ``ctr images import`` into the
real node's containerd, where the chart's pods run it with ``imagePullPolicy: Never``.

Cached under ``cache_root()/images``: the stand-in's tar once (mmdebstrap is the slow,
network-bound half), and the image per hash of what the build reads (:func:`product_key`),
with a JSON record beside it of what its cold build took. buildah's own storage
(``/var/lib/containers``) keeps nothing of ours after a build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from unthrottle_lab.kube.build import BuildError, _locked, cache_root, ensure_node_built
from unthrottle_lab.kube.images import Image
from unthrottle_lab.kube.node import RealNode

__all__ = [
    "BASE_NAME",
    "REPOSITORY",
    "BuildRecord",
    "build_product_image",
    "build_record",
    "cached_product_image",
    "import_image",
    "product_key",
    "repository_and_tag",
]

ROOT = Path(__file__).resolve().parents[4]
"""The checkout: its Dockerfile and build context."""
REPOSITORY = "docker.io/library/unthrottle"
"""What containerd lists the image as (a name without a registry is ``docker.io/library``'s,
there as in the kubelet): the chart's ``image.repository``; its tag is the version."""
BASE_NAME = "localhost/unthrottle-base:bookworm-python3.11"
"""The stand-in base, as buildah knows it while a build runs."""
BASE_PACKAGES = ["python3.11", "python3-venv", "python3-pip", "ca-certificates", "passwd"]
"""What the official slim image has that the Dockerfile uses: Python with venv and pip, the
certificates pip reaches PyPI with, and ``groupadd``/``useradd`` (minbase lacks passwd)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The official image's PATH: without the sbin folders the Dockerfile's groupadd is not
found."""
CONTEXT = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md"]
"""What the build reads besides ``src/`` (.dockerignore lets in no more)."""
KEEP = 3
"""Images kept in the cache (the newest): a few checkouts or branches share it."""
_HINT = "run `make image` as root (it installs Debian's buildah and mmdebstrap)"


@dataclass(frozen=True)
class BuildRecord:
    """What the cold build of one cached image took, written beside its archive."""

    key: str
    """The hash of what the build read (:func:`product_key`)."""
    name: str
    """The image's name in the archive, ``REPOSITORY:<version>``."""
    base_tar_s: float | None
    """mmdebstrap's seconds for the stand-in's tar; None when the cache had it."""
    base_image_s: float
    """Seconds to make the tar a buildah image (untar, links, commit)."""
    bud_s: float
    """``buildah bud``'s seconds: both stages, pip resolving and installing from PyPI."""
    push_s: float
    """Seconds to write the docker-archive."""
    size_bytes: int
    """The image's layers, uncompressed: what it takes on a node."""


def _say(text: str) -> None:
    print(f"image: {text}", file=sys.stderr, flush=True)


def _run(args: list[str], *, timeout_s: float = 900) -> str:
    """Run a build step; its stdout, or BuildError with the end of what it said."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-4000:]
        raise BuildError(f"{' '.join(args[:3])} … failed ({done.returncode}):\n{said}")
    return done.stdout.strip()


def _version(root: Path) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def _context_files(root: Path) -> list[Path]:
    """What the build reads: CONTEXT and ``src/`` less what .dockerignore leaves out
    (bytecode and egg-info change with every test run, and the build never sees them)."""
    source = sorted(
        p for p in (root / "src").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
        and not any(part.endswith(".egg-info") for part in p.parts)
    )  # fmt: skip
    return [root / name for name in CONTEXT] + source


def _base_recipe() -> tuple[list[str], list[str]]:
    """mmdebstrap's options and suite, and its mirrors (they follow the output's path): the
    stand-in's tar is cached per recipe. Valid-Until is not checked, as the host's apt does
    not (its mirror may serve a snapshot of the archive)."""
    options = [
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        '--aptopt=Acquire::Check-Valid-Until "false"',
        "--format=tar",
        "bookworm",
    ]
    return options, _host_mirrors()


def _recipe_key() -> str:
    options, mirrors = _base_recipe()
    return hashlib.sha256("\0".join(options + mirrors).encode()).hexdigest()[:12]


def product_key(root: Path = ROOT) -> str:
    """A hash of what the build reads, and of the stand-in's recipe."""
    digest = hashlib.sha256(_recipe_key().encode())
    for path in _context_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _archive(root: Path) -> Path:
    return cache_root() / "images" / f"unthrottle-{product_key(root)}.tar"


def cached_product_image(root: Path = ROOT) -> Image | None:
    """The image for this checkout when the cache has it, else None (nothing is built)."""
    archive = _archive(root)
    if archive.is_file() and archive.with_suffix(".json").is_file():
        return Image(f"{REPOSITORY}:{_version(root)}", archive)
    return None


def build_record(image: Image) -> BuildRecord:
    """What the cold build of a cached image took (the JSON beside its archive)."""
    return BuildRecord(**json.loads(image.archive.with_suffix(".json").read_text()))


def repository_and_tag(image: Image) -> tuple[str, str]:
    """``image.repository`` and ``image.tag`` for the chart."""
    repository, _, tag = image.name.rpartition(":")
    return repository, tag


# -- the stand-in base -----------------------------------------------------------------------


def _host_mirrors() -> list[str]:
    """The host's own Debian sources for bookworm, as one-line ``deb`` entries: mmdebstrap
    reaches the archive the way apt does here. Empty: mmdebstrap's default mirror."""
    lines: list[str] = []
    folder = Path("/etc/apt/sources.list.d")
    for path in sorted(folder.glob("*.sources")) if folder.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines()
                if ":" in line and not line.startswith(("#", " "))
            )  # fmt: skip
            fields = {k.strip(): v.strip() for k, v in fields.items()}
            if "deb" not in fields.get("Types", "").split():
                continue
            for suite in fields.get("Suites", "").split():
                if suite.startswith("bookworm"):
                    lines.append(f"deb {fields['URIs'].split()[0]} {suite} "
                                 f"{fields.get('Components', 'main')}")  # fmt: skip
    return lines


def _base_tar() -> tuple[Path, float | None]:
    """The stand-in's root filesystem as a tar, made by mmdebstrap once per recipe."""
    options, mirrors = _base_recipe()
    out = cache_root() / "images" / f"base-bookworm-python3.11-{_recipe_key()}.tar"
    if out.is_file():
        return out, None
    _say(f"mmdebstrap: Debian bookworm with {', '.join(BASE_PACKAGES)} (once; ~25 s) …")
    begun = time.monotonic()
    partial = out.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    try:
        _run(["mmdebstrap", "--quiet", *options, str(partial), *mirrors])
        partial.rename(out)
    finally:
        partial.unlink(missing_ok=True)
    return out, time.monotonic() - begun


def _base_image(tar: Path) -> float:
    """``BASE_NAME`` in buildah's storage, from the tar: Debian's Python where the official
    image has its own (``/usr/local/bin``), and the official image's PATH."""
    begun = time.monotonic()
    container = _run(["buildah", "from", "scratch"])
    try:
        mount = Path(_run(["buildah", "mount", container]))
        _run(["tar", "--extract", "--numeric-owner", "--file", str(tar), "--directory", str(mount)])
        local = mount / "usr" / "local" / "bin"
        local.mkdir(parents=True, exist_ok=True)
        for name, target in (("python", "python3.11"), ("python3", "python3.11"),
                             ("pip", "pip3"), ("pip3", "pip3")):  # fmt: skip
            (local / name).unlink(missing_ok=True)
            (local / name).symlink_to(f"/usr/bin/{target}")
        _run(["buildah", "umount", container])
        _run(["buildah", "config", f"--env=PATH={PATH}", "--cmd=python3", container])
        _run(["buildah", "commit", "--quiet", "--rm", container, BASE_NAME])
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    return time.monotonic() - begun


# -- the product -----------------------------------------------------------------------------


def _runtime() -> Path:
    """The node's runc (buildah's runtime: Debian's buildah brings none without its
    recommends)."""
    try:
        return ensure_node_built().path("runc")
    except BuildError as error:
        raise BuildError(f"buildah runs with the real node's runc: run `make controlplane` "
                         f"first ({error})") from None  # fmt: skip


def _bud(root: Path, name: str, runtime: Path) -> float:
    """``buildah bud`` of the Dockerfile on the stand-in, pip reaching PyPI through the
    host's network and certificates (and its pip.conf, where it has one)."""
    volumes = ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    if Path("/etc/pip.conf").is_file():
        volumes += ["-v", "/etc/pip.conf:/etc/pip.conf:ro"]
    _say(f"buildah bud {root} on {BASE_NAME} (~1 min) …")
    begun = time.monotonic()
    _run(["buildah", "bud", "--pull-never", "--runtime", str(runtime), "--network", "host",
          "--isolation", "chroot", *volumes, "--build-arg", f"BASE_IMAGE={BASE_NAME}",
          "--quiet", "-t", name, str(root)])  # fmt: skip
    return time.monotonic() - begun


def _layers_size(archive: Path) -> int:
    """The uncompressed size of the archive's layers (docker-archive keeps them as tars)."""
    with tarfile.open(archive) as tar:
        manifest = tar.extractfile("manifest.json")
        assert manifest is not None
        layers = json.load(manifest)[0]["Layers"]
        return sum(tar.getmember(layer).size for layer in layers)


def _clean(*names: str) -> None:
    """Remove our images from buildah's storage, and the intermediate ones a multi-stage
    build leaves unnamed: the archive in our cache is what is kept."""
    for name in names:
        subprocess.run(["buildah", "rmi", "--force", name], capture_output=True, check=False)
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, check=False)


def _need_tools() -> Path:
    """buildah, mmdebstrap, root and the node's runc, or an error saying what to run;
    the runtime's path."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"the image is built with {' and '.join(missing)}, not installed: {_HINT}")
    if os.geteuid() != 0:
        raise BuildError(f"buildah and mmdebstrap build the image as root: {_HINT}")
    return _runtime()


def _build(root: Path, name: str, archive: Path, runtime: Path) -> BuildRecord:
    """Base, bud, push into ``archive`` (whole or not at all), and the record beside it.
    buildah tags the image with the archive's name: push writes every name an image has
    into the archive, and ctr would import each of them."""
    tar, base_tar_s = _base_tar()
    partial = archive.with_suffix(".partial")
    try:
        base_image_s = _base_image(tar)
        bud_s = _bud(root, name, runtime)
        begun = time.monotonic()
        partial.unlink(missing_ok=True)
        _run(["buildah", "push", "--quiet", name, f"docker-archive:{partial}:{name}"])
        push_s = time.monotonic() - begun
        record = BuildRecord(archive.stem.removeprefix("unthrottle-"), name, base_tar_s,
                             base_image_s, bud_s, push_s, _layers_size(partial))  # fmt: skip
        archive.with_suffix(".json").write_text(json.dumps(asdict(record), indent=1) + "\n")
        partial.rename(archive)
    finally:
        partial.unlink(missing_ok=True)
        _clean(name, BASE_NAME)
    return record


def build_product_image(root: Path = ROOT) -> Image:
    """The product's image built from ``root``'s Dockerfile (see the module's docstring),
    as a docker-archive in the cache: at once when the cache has it for what the build
    reads, else built (about a minute and a quarter from cold, progress on stderr)."""
    cached = cached_product_image(root)
    if cached is not None:
        return cached
    runtime = _need_tools()
    image = Image(f"{REPOSITORY}:{_version(root)}", _archive(root))
    image.archive.parent.mkdir(parents=True, exist_ok=True)
    with _locked(image.archive.parent / ".product.lock"):
        if not image.archive.is_file():  # else another run built it meanwhile
            record = _build(root, image.name, image.archive, runtime)
            _say(f"built {record.name} in {record.bud_s:.0f} s, "
                 f"{record.size_bytes / 1e6:.0f} MB")  # fmt: skip
        _prune(image.archive.parent, keep=KEEP)
    return image


def _prune(folder: Path, *, keep: int) -> None:
    """Only the ``keep`` newest images stay in the cache: each is 630 MB, and every edit
    of ``src/`` makes another key."""
    archives = sorted(folder.glob("unthrottle-*.tar"), key=lambda p: p.stat().st_mtime)
    for old in archives[:-keep]:
        old.with_suffix(".json").unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def import_image(node: RealNode, image: Image) -> None:
    """Import the archive into the node's containerd (the kubelet's ``k8s.io`` namespace)
    and pin it, as the node does its own images: the kubelet's image GC keeps it, and pods
    run it with ``imagePullPolicy: Never``."""
    node.ctr("images", "import", "--no-unpack=false", str(image.archive))
    node.ctr("images", "label", image.name, "io.cri-containerd.pinned=pinned")
