"""The real node's two images, built here: no registry is reached, so the node pulls nothing.

- **pause**: the pod sandbox's process, our static ``pause`` binary (controlplane/node).
- **workload**: the laboratory's ``unthrottle-lab`` (and the product beneath it), to run
  ``unthrottle-lab workload FILE`` in a real container. It holds this checkout's Python
  as it is installed here, at the same paths: the interpreter and its standard library,
  the packages the CLI imports, the project's source, and the shared libraries those load
  (``ldd``). So the image is only good on this machine, with this checkout, which is what
  a local node needs; a published image is built by the project's Dockerfile.

Each is a docker-archive tar (``manifest.json``, a config, one layer), written with fixed
times and owners so the same inputs make the same image, and imported with
``ctr images import`` into the ``k8s.io`` namespace the kubelet's containerd reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Image", "build_pause", "build_workload", "workload_files"]

# what the standard library has that the workload never loads (tests alone are 30 MB)
_STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "pydoc_data",
    "distutils",
    Path(sysconfig.get_config_var("LIBPL") or "config").name,  # the static libpython
}
_PACKAGE_SKIP = {"tests", "f2py", "distutils", "__pycache__"}
"""In the packages the CLI imports: their own test suites and build tools (numpy's)."""
_CLI = "unthrottle_lab.cli"


@dataclass(frozen=True)
class Image:
    """An image written as a docker-archive tar, and the name it is imported under."""

    name: str
    archive: Path


def _ldd(path: Path) -> list[Path]:
    """The shared libraries a binary or library loads, the dynamic loader included."""
    done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
    found = []
    for line in done.stdout.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1:
            target = words[words.index("=>") + 1]
            if target.startswith("/"):
                found.append(Path(target))
        elif words and words[0].startswith("/"):
            found.append(Path(words[0]))  # the loader: /lib64/ld-linux-x86-64.so.2
    return found


def _tree(root: Path, *, skip: set[str] = frozenset()) -> Iterator[Path]:  # type: ignore[assignment]
    for path in sorted(root.rglob("*")):
        if path.is_file() and not skip.intersection(path.relative_to(root).parts):
            yield path


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _imported_tops() -> set[str]:
    """The top-level names in site-packages that the CLI imports, read from a fresh
    interpreter (this one has loaded more than the CLI needs)."""
    code = "\n".join([
        f"import sys, {_CLI}",
        "for m in list(sys.modules.values()):",
        "    print(getattr(m, '__file__', '') or '')",
    ])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    site = str(_site_packages()) + "/"
    return {line[len(site):].split("/")[0] for line in done.stdout.splitlines()
            if line.startswith(site)}  # fmt: skip


def _sources() -> list[Path]:
    """The product's and the laboratory's source folders, as this interpreter imports them."""
    import unthrottle

    return [Path(unthrottle.__file__).resolve().parent, Path(__file__).resolve().parents[1]]


def workload_files() -> list[Path]:
    """Every file the workload image holds, at its path on this machine."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    files: list[Path] = [Path(sys.executable), Path(sys.prefix) / "pyvenv.cfg"]
    files += [p for p in (Path(sys.prefix) / "bin").iterdir() if p.name.startswith("python")]
    files += [Path(sys.prefix) / "bin" / "unthrottle", Path(sys.prefix) / "bin" / "unthrottle-lab"]
    files += _tree(base / "lib" / version, skip=_STDLIB_SKIP)
    files += [p for p in (base / "lib").glob("libpython*.so*")]
    site = _site_packages()
    for top in sorted(_imported_tops()):
        files += [site / top] if (site / top).is_file() else _tree(site / top, skip=_PACKAGE_SKIP)
    for extra in sorted(site.iterdir()):  # editable installs' paths, the .libs numpy loads
        if (
            extra.suffix == ".pth"
            or extra.name.startswith("__editable__")
            or (extra.name.endswith(".libs") and extra.name.split(".")[0] in _imported_tops())
        ):
            files += [extra] if extra.is_file() else _tree(extra)
    for source in _sources():  # src/unthrottle and lab/src/unthrottle_lab (editable installs)
        files += _tree(source, skip={"__pycache__"})
    native = [
        f for f in files if f.suffix == ".so" or ".so." in f.name or f == Path(sys.executable)
    ]
    libs = {lib for f in native for lib in _ldd(f.resolve())}
    return sorted(set(files) | libs)


def _add(tar: tarfile.TarFile, path: Path, added: set[str]) -> None:
    """``path`` at its own place in the image: each symbolic link on the way (a file's or
    a folder's, such as Debian's /lib → usr/lib) as a link, then what it points to."""
    parts = path.parts[1:]
    for depth in range(1, len(parts) + 1):
        here = Path("/", *parts[:depth])
        name = here.as_posix().lstrip("/")
        if here.is_symlink():
            target = os.readlink(here)
            if name not in added:
                info = tarfile.TarInfo(name)
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                tar.addfile(info)
                added.add(name)
            pointed = Path(os.path.normpath(here.parent / target))
            _add(tar, Path(pointed, *parts[depth:]), added)
            return
        if name in added:
            continue
        info = tarfile.TarInfo(name)
        if here.is_dir():
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        else:
            stat = here.stat()
            info.size, info.mode = stat.st_size, stat.st_mode & 0o7777
            with here.open("rb") as handle:
                tar.addfile(info, handle)
        added.add(name)


def _layer(files: Iterable[Path], extra_dirs: Iterable[str] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        added: set[str] = set()
        for name in extra_dirs:  # mount points the runtime expects to find
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
            added.add(name)
        for path in files:
            _add(tar, path, added)
    return buffer.getvalue()


def _archive(out: Path, repo: str, layer: bytes, config: dict[str, object]) -> Image:
    digest = hashlib.sha256(layer).hexdigest()
    name = f"docker.io/library/{repo}:{digest[:12]}"
    image_config = {
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
    }  # fmt: skip
    manifest = [{"Config": "config.json", "RepoTags": [name], "Layers": ["layer.tar"]}]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for member, data in (("manifest.json", json.dumps(manifest).encode()),
                             ("config.json", json.dumps(image_config).encode()),
                             ("layer.tar", layer)):  # fmt: skip
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return Image(name, out)


def build_pause(pause_binary: Path, out: Path) -> Image:
    """The sandbox image: our pause program as ``/pause``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        data = pause_binary.read_bytes()
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return _archive(out, "unthrottle-pause", buffer.getvalue(),
                    {"Entrypoint": ["/pause"], "WorkingDir": "/"})  # fmt: skip


def _files_key(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def build_workload(folder: Path) -> Image:
    """The workload image: ``unthrottle-lab`` with this checkout's Python (see the module's
    docstring); its entrypoint is the ``unthrottle-lab`` command. Written once into
    ``folder`` per set of files (their paths, sizes and times), and reused."""
    files = workload_files()
    out = folder / f"workload-{_files_key(files)}.tar"
    manifest = out.with_suffix(".name")
    if out.is_file() and manifest.is_file():
        return Image(manifest.read_text().strip(), out)
    layer = _layer(files, extra_dirs=("tmp", "proc", "sys", "dev", "etc"))
    entry = str(Path(sys.prefix) / "bin" / "unthrottle-lab")
    partial = out.with_suffix(".partial")
    image = _archive(partial, "unthrottle-workload", layer, {
        "Entrypoint": [entry], "WorkingDir": "/",
        "Env": [f"PATH={Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
    })  # fmt: skip
    partial.rename(out)
    manifest.write_text(image.name + "\n")
    return Image(image.name, out)
