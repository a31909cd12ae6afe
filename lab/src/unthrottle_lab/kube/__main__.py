"""``python -m unthrottle_lab.kube up DIR [--nodes N] [--kubelet]`` and ``… build``.

``up`` builds the binaries when the cache has none (progress on stderr), links them into
``DIR/bin/``, starts the control plane with its state in ``DIR``, writes
``DIR/kubeconfig`` and prints one line, ``ready DIR/kubeconfig``, on stdout. With
``--kubelet`` it also starts one real node (containerd, runc and a kubelet:
:mod:`.node`), state in ``DIR/node/``, and writes ``DIR/kubelet.json`` before that line:
``{"node", "endpoint", "cgroup_root", "images": {"workload", "pause"}, …}``. It runs until
SIGINT or SIGTERM, then ends everything it started, by PID, and removes what it wrote
(after a SIGKILL, the node's guard does). ``build`` builds the control plane's and the
node's binaries, Prometheus with Kubernetes discovery and Thanos. ``image`` builds the
product's image from the Dockerfile (:mod:`.image`) when the cache has none for this
checkout, and prints its archive's path, its name, and whether it was cached, with what
its cold build took.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from unthrottle_lab.kube.build import BuildError, ensure_built, ensure_node_built
from unthrottle_lab.kube.cluster import ControlPlane, StartError
from unthrottle_lab.kube.image import build_product_image, build_record, cached_product_image
from unthrottle_lab.kube.node import RealNode
from unthrottle_lab.kube.prometheus_build import ensure_prometheus_built
from unthrottle_lab.kube.thanos_build import ensure_thanos_built


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM as SIGINT: stop what was started, wherever we are


def _up(folder: Path, nodes: int, *, kubelet: bool) -> int:
    signal.signal(signal.SIGINT, _interrupt)  # also where a script started us ignoring it
    signal.signal(signal.SIGTERM, _interrupt)
    binaries = ensure_built()
    node_binaries = ensure_node_built() if kubelet else None
    folder.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(folder, nodes=nodes, binaries=binaries)
    plane.link_binaries(folder / "bin")
    node: RealNode | None = None
    try:
        plane.start()
        real = ""
        if node_binaries is not None:
            node = RealNode(plane, folder / "node")
            node.start()
            (folder / "kubelet.json").write_text(json.dumps(node.info(), indent=1) + "\n")
            real = f", a real node {node.name} (ready in {node.started_in_s:.1f} s)"
        print(f"ready {plane.kubeconfig}", flush=True)
        print(
            f"control plane: Kubernetes {plane.version} at {plane.server}, {nodes} fake "
            f"nodes{real}, ready in {plane.started_in_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        while True:
            time.sleep(1)
            gone = plane.exited() + (node.exited() if node else [])
            if gone:
                print(f"control plane: {', '.join(gone)} exited; stopping", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if node is not None:
            node.stop()
            (folder / "kubelet.json").unlink(missing_ok=True)
        plane.stop()


def _image() -> int:
    """Build (or find) the product's image; what a user needs to know of it, on stdout."""
    cached = cached_product_image() is not None
    image = build_product_image()
    record = build_record(image)
    base = ("cached" if record.base_tar_s is None else f"{record.base_tar_s:.0f} s") + (
        f" + {record.base_image_s:.0f} s into buildah"
    )
    print(image.archive)
    print(image.name)
    print(
        f"{'cached' if cached else 'built'}: cold build: base {base}, bud {record.bud_s:.0f} s, "
        f"push {record.push_s:.0f} s; {record.size_bytes / 1e6:.0f} MB uncompressed"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unthrottle_lab.kube")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a control plane; ready DIR/kubeconfig")
    up.add_argument("folder", type=Path, metavar="DIR")
    up.add_argument("--nodes", type=int, default=3, help="fake nodes (kwok), default 3")
    up.add_argument("--kubelet", action="store_true",
                    help="also one real node: containerd, runc and a kubelet (root)")  # fmt: skip
    commands.add_parser("build", help="build the binaries into the cache (if not there)")
    commands.add_parser("image", help="build the product's image from the Dockerfile into the "
                        "cache (if not there): archive, name, cold build figures")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(ensure_built().folder)
            print(ensure_node_built().folder)
            print(ensure_prometheus_built())
            print(ensure_thanos_built())
            return 0
        if args.command == "image":
            return _image()
        if not 0 <= args.nodes <= 100:
            parser.error("--nodes: between 0 and 100")
        if args.kubelet and os.geteuid() != 0:
            parser.error("--kubelet: a real node needs root (cgroups, mounts, a bridge)")
        return _up(args.folder.resolve(), args.nodes, kubelet=args.kubelet)
    except (BuildError, StartError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
