"""cgroup access on the real kernel: create, configure, count, remove (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from missing import MISSING
from unthrottle.cgroups import Cgroup, CgroupError, Layout
from unthrottle.units import Bandwidth

pytestmark = pytest.mark.kernel


def busy_child(seconds: float) -> subprocess.Popen[bytes]:
    """A process that waits for a line on stdin, then spins for ``seconds``."""
    code = (
        f"import sys,time; sys.stdin.readline(); end=time.monotonic()+{seconds!r}\n"
        "while time.monotonic()<end: pass"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


@pytest.fixture
def cgroup(layout: Layout) -> Cgroup:
    cg = Cgroup(layout, f"unthrottle-test-{os.getpid()}")
    cg.create()
    yield cg
    cg.remove()


def test_settings_written_are_what_the_kernel_reports(cgroup: Cgroup) -> None:
    for bandwidth in (Bandwidth(20_000, 50_000, 10_000), Bandwidth(5_000, 10_000), Bandwidth()):
        cgroup.write_bandwidth(bandwidth)
        assert cgroup.read_bandwidth() == bandwidth


def test_lowering_the_quota_under_the_burst_in_force_still_works(cgroup: Cgroup) -> None:
    cgroup.write_bandwidth(Bandwidth(80_000, 100_000, 80_000))
    cgroup.write_bandwidth(Bandwidth(10_000, 100_000, 5_000))
    assert cgroup.read_bandwidth() == Bandwidth(10_000, 100_000, 5_000)


def test_a_quota_under_the_burst_in_force_is_refused_and_changes_nothing(cgroup: Cgroup) -> None:
    """What an in-place resize meets: the kubelet writes only the quota, and this kernel
    refuses one under the burst the agent wrote (EINVAL); the settings stay as they were."""
    if not cgroup.supports_burst():
        pytest.skip(f"{MISSING} this kernel has no CPU burst (Linux 5.14+)")
    cgroup.write_bandwidth(Bandwidth(80_000, 100_000, 60_000))
    with pytest.raises(CgroupError, match="EINVAL"):
        cgroup.write_quota(40_000)
    assert cgroup.read_bandwidth() == Bandwidth(80_000, 100_000, 60_000)


def test_a_quota_write_keeps_the_burst_so_burst_first_then_quota_lowers_both(
    cgroup: Cgroup,
) -> None:
    """The order unthrottle's InPlace uses: lower the burst, then the quota; raise the quota,
    then the burst. Each write leaves the other setting as it was."""
    if not cgroup.supports_burst():
        pytest.skip(f"{MISSING} this kernel has no CPU burst (Linux 5.14+)")
    cgroup.write_bandwidth(Bandwidth(80_000, 100_000, 60_000))
    cgroup.write_burst(20_000)
    cgroup.write_quota(40_000)
    assert cgroup.read_bandwidth() == Bandwidth(40_000, 100_000, 20_000)
    cgroup.write_quota(90_000)
    assert cgroup.read_bandwidth() == Bandwidth(90_000, 100_000, 20_000)
    cgroup.write_burst(70_000)
    assert cgroup.read_bandwidth() == Bandwidth(90_000, 100_000, 70_000)


def test_a_busy_process_under_a_small_quota_is_throttled_and_counted(cgroup: Cgroup) -> None:
    cgroup.write_bandwidth(Bandwidth(4_000, 20_000))  # 0.2 CPU, 20 ms periods
    child = busy_child(0.4)
    try:
        cgroup.add_process(child.pid)
        assert child.pid in cgroup.pids()
        before = cgroup.read_stat()
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        child.wait(timeout=10)
        delta = cgroup.read_stat() - before
    finally:
        child.kill()
        child.wait()
    # ~20 periods of 20 ms; nearly all throttled; usage bounded by the quota plus tick overruns.
    assert 15 <= delta.nr_periods <= 30
    assert delta.nr_throttled >= 0.7 * delta.nr_periods
    assert delta.usage_us <= delta.nr_periods * 4_000 + 2 * 4_000 + 10_000
    assert delta.usage_us >= 0.5 * delta.nr_throttled * 4_000
    assert delta.throttled_us >= delta.nr_throttled * 8_000  # stopped most of each period


def test_removing_a_cgroup_that_still_has_a_process_says_it_is_busy(cgroup: Cgroup) -> None:
    child = busy_child(30)
    try:
        cgroup.add_process(child.pid)
        with pytest.raises(CgroupError, match="busy"):
            cgroup.remove(timeout_s=0.2)
    finally:
        child.kill()
        child.wait()
    time.sleep(0.05)


def test_a_user_who_is_not_root_is_told_to_run_as_root(layout: Layout) -> None:
    # Import as root (the virtualenv may sit where nobody can read), then drop to nobody.
    code = (
        "import os\nfrom unthrottle.cgroups import Cgroup, detect_layout, CgroupError\n"
        "layout = detect_layout()\nos.setgid(65534)\nos.setuid(65534)\n"
        "try:\n    Cgroup(layout, 'unthrottle-test-nobody').create()\n"
        "except CgroupError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "unthrottle-test-nobody: permission denied" in out.stdout
    assert "run as root" in out.stdout
