"""The Debian package (issue 13): `make deb`, then the package in a fresh Debian 12 root.

The module builds the package, repacks it as version ``<version>+2`` (an upgrade: what it
exercises is dpkg's handling of conffiles, state and maintainer scripts across versions,
which a second compile would not change), makes a fresh bookworm root with mmdebstrap from the Debian mirror holding the
package's dependencies, and then, in that root (chroot, no systemd running):

* ``dpkg -i`` installs it; ``honk check`` accepts the shipped configuration; the
  kernels are the compiled ones and the vendored QUIC stack imports;
* ``honk run`` serves the demo configuration and one SOCKS5 request crosses it to an
  echo server on this machine's loopback; honkctl reads its API;
* ``systemd-analyze verify`` accepts the unit; booted with systemd as PID 1 (systemd-nspawn),
  the enabled unit starts, is active once honk says READY=1, holds only its capabilities and
  reloads;
* the second version installed over the first keeps an edited configuration, the API
  secret and the state directory; ``apt-get purge`` then leaves nothing honk made.

It needs root (chroot, mmdebstrap), the Debian mirror and PyPI (the vendored wheels).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from helpers.peers import require_binary, require_root
from helpers.servers import EchoServer
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

from honk import __version__

# the first test sets up a package build and a Debian root (over a minute on an idle 2-core
# machine): beyond the suite's 120 s per test
pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
UPGRADE_VERSION = f"{__version__}+2"
INSTALLED_SIZE_BUDGET_KIB = 25 * 1024  # "target: installed size <= 25 MiB"
STEP = 30.0  # seconds a daemon may take to get ready or to stop
CHROOT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
}
# what a Debian root holds that installs, purges and the tests' own tools legitimately change
# (dpkg's and apt's records, logs, caches; run/systemd is systemd-analyze's scratch, var/lib/systemd
# and the machine id are what booting the root under systemd writes)
CHURN = re.compile(
    r"^\./(var/lib/dpkg|var/lib/apt|var/cache|var/log|tmp|etc/ld\.so\.cache|etc/systemd/system"
    r"|run/systemd|var/lib/systemd|etc/machine-id)(/|$)"
)


def _run(*argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kwargs)


def _build() -> Path:
    done = subprocess.run([str(REPO / "packaging/deb/build.sh")], text=True, capture_output=True)
    assert done.returncode == 0, f"make deb failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    arch = _run("dpkg", "--print-architecture").stdout.strip()
    deb = REPO / "dist" / f"honk_{__version__}_{arch}.deb"
    assert deb.is_file(), done.stdout
    return deb


def _as_version(deb: Path, version: str) -> Path:
    """``deb`` again under ``version``: the same files, conffiles and maintainer scripts."""
    tree = deb.parent / f"repack-{version}"
    shutil.rmtree(tree, ignore_errors=True)
    _run("dpkg-deb", "-R", str(deb), str(tree))
    control = tree / "DEBIAN" / "control"
    control.write_text(re.sub(r"^Version: .*$", f"Version: {version}", control.read_text(), flags=re.M))
    out = deb.with_name(deb.name.replace(f"_{__version__}_", f"_{version}_"))
    _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(tree), str(out))
    shutil.rmtree(tree)
    return out


def _depends(deb: Path) -> list[str]:
    """The package names of ``deb``'s Depends (versions and alternatives dropped)."""
    field = _run("dpkg-deb", "-f", str(deb), "Depends").stdout
    return sorted({part.split("|")[0].split("(")[0].strip() for part in field.split(",") if part.strip()})


@pytest.fixture(scope="module")
def debs() -> tuple[Path, Path]:
    require_root("building the package (its build dependencies from apt) and installing it in a chroot")
    first = _build()
    return first, _as_version(first, UPGRADE_VERSION)


@pytest.fixture(scope="module")
def root(debs, tmp_path_factory) -> Path:
    """A fresh bookworm root with the package's dependencies, systemd and man-db; the package
    installed with dpkg."""
    require_binary("mmdebstrap")
    first, _ = debs
    base = tmp_path_factory.mktemp("debian-root")
    tree = base / "root"
    include = ",".join([*_depends(first), "systemd", "man-db"])
    done = subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=apt", f"--include={include}", SUITE, str(tree), MIRROR],
        text=True,
        capture_output=True,
    )
    assert done.returncode == 0, f"mmdebstrap failed:\n{done.stderr[-3000:]}"
    (base / "before.txt").write_text(_listing(tree))
    shutil.copy(first, tree / "tmp" / first.name)
    _chroot(tree, "dpkg", "-i", f"/tmp/{first.name}")
    return tree


def _chroot(tree: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["chroot", str(tree), *argv], text=True, capture_output=True, env=CHROOT_ENV)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def _listing(tree: Path) -> str:
    """Every path in ``tree`` (relative, sorted) but the ones installs and purges churn."""
    paths = _run("find", ".", "-xdev", cwd=tree).stdout.splitlines()
    return "\n".join(sorted(p for p in paths if not CHURN.match(p)))


def test_make_deb_builds_a_lintian_clean_package_within_the_size_budget(debs) -> None:
    first, _ = debs  # build.sh fails the build on any lintian error or warning
    fields = {
        key: _run("dpkg-deb", "-f", str(first), key).stdout.strip()
        for key in ("Package", "Version", "Installed-Size", "Depends")
    }
    assert (fields["Package"], fields["Version"]) == ("honk", __version__)
    assert int(fields["Installed-Size"]) <= INSTALLED_SIZE_BUDGET_KIB
    for dependency in ("python3-cryptography", "python3-aioquic", "python3-pyroute2"):
        assert dependency not in fields["Depends"]  # too old or missing in Debian 12: vendored, or not needed
    contents = _run("dpkg-deb", "-c", str(first)).stdout
    for path in (
        "./usr/bin/honk",
        "./usr/bin/honkctl",
        "./etc/honk/config.dae",
        "./lib/systemd/system/honk.service",
        "./usr/share/man/man8/honk.8.gz",
        "./usr/share/man/man1/honkctl.1.gz",
        "./usr/lib/honk/honk/ebpf/datapath.bpf.o",
        "./usr/lib/honk/vendor/aioquic/__init__.py",
    ):
        assert path in contents, path
    assert "/cython" not in contents.lower()  # the twins need no Cython at run time (honk/_fast/_cython.py)
    assert re.search(r"\./usr/lib/honk/honk/_fast/relay_c\.cpython-311-\S+\.so", contents)
    assert not re.search(
        r"\./usr/lib/honk/honk/\S+\.(c|pyx|pxd)\n", contents
    )  # honk's kernels: compiled only
    conffiles = subprocess.run(
        ["dpkg-deb", "-I", str(first), "conffiles"], text=True, capture_output=True
    ).stdout
    assert conffiles.split() == ["/etc/honk/config.dae"]


def test_the_installed_package_checks_its_config_and_runs_compiled_with_its_vendored_quic(root) -> None:
    assert "ok:" in _chroot(root, "honk", "check", "/etc/honk/config.dae").stdout
    probe = (
        "import sys; sys.path[:0] = ['/usr/lib/honk', '/usr/lib/honk/vendor']\n"
        "from honk import _fast; import aioquic.quic.connection, cryptography\n"
        "assert set(_fast.implementations().values()) == {'compiled'}, _fast.implementations()\n"
        "import importlib.util, honk._fast.cell_py, honk._fast.rank_py  # twins, without Cython\n"
        "assert importlib.util.find_spec('cython') is None\n"
        "print(cryptography.__version__)"
    )
    assert _chroot(root, "python3", "-c", probe).stdout.strip().split(".")[0] >= "43"
    api = (root / "etc/honk/api.dae").read_text()
    assert (
        re.search(r"secret: '[0-9a-f]{48}'", api) and (root / "etc/honk/api.dae").stat().st_mode & 0o077 == 0
    )
    assert (root / "var/lib/honk").is_dir()
    assert "honkctl" in _chroot(root, "man", "-P", "cat", "honkctl").stdout


def test_honk_run_in_the_root_serves_the_demo_and_proxies_a_request(root) -> None:
    demo = root / "tmp/demo"
    demo.mkdir(exist_ok=True)
    text = (REPO / "configs/demo.dae").read_text()
    (demo / "demo.dae").write_text(
        text.replace("127.0.0.1:7890", "127.0.0.1:0").replace("127.0.0.1:9090", "127.0.0.1:0")
    )
    proc = subprocess.Popen(
        [
            "chroot",
            str(root),
            "/usr/bin/honk",
            "run",
            "-c",
            "/tmp/demo/demo.dae",
            "--pid-file",
            "/tmp/demo/honk.pid",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=CHROOT_ENV,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "honk ready" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(STEP), "".join(lines)
        line = next(entry for entry in lines if "honk ready" in entry)
        port = int(re.search(r"inbound\.lan=127\.0\.0\.1:(\d+)", line).group(1))
        api = re.search(r"api=(127\.0\.0\.1:\d+)", line).group(1)
        with EchoServer() as echo:
            sock, reply = socks5_connect(("127.0.0.1", port), "127.0.0.1", echo.port)
            with sock:
                assert reply == 0
                assert roundtrip(sock, b"through the packaged honk") == b"through the packaged honk"
        status = _chroot(root, "honkctl", "--api", f"http://{api}", "status").stdout
        assert re.search(r"^honk\s+" + re.escape(__version__), status, re.M)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STEP) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any("Traceback" in entry for entry in lines), "".join(lines)


def test_systemd_analyze_verify_accepts_the_unit(root) -> None:
    done = _chroot(root, "systemd-analyze", "verify", "/lib/systemd/system/honk.service")
    assert done.stderr.strip() == ""


PROBE_UNIT = """[Unit]
Description=what honk.service did under systemd, for the test
After=honk.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c '{ systemctl is-active honk; \\
    systemctl show honk -p Type -p ActiveState -p SubState -p StatusText -p CapabilityBoundingSet; \\
    systemctl reload honk && echo reload=ok; systemctl show honk -p ActiveState -p StatusText; \\
    } > /honk-probe.txt 2>&1; systemctl poweroff'
"""


def test_under_systemd_the_unit_starts_notifies_ready_with_its_capabilities_and_reloads(root) -> None:
    """The root booted with systemd as PID 1 (systemd-nspawn): the enabled honk.service starts on
    the shipped configuration, is active once honk said READY=1, holds only its four
    capabilities, and `systemctl reload` goes through `honk reload`."""
    require_binary("systemd-nspawn")
    unit = root / "etc/systemd/system/honk-probe.service"
    wants = root / "etc/systemd/system/multi-user.target.wants/honk-probe.service"
    result = root / "honk-probe.txt"
    unit.write_text(PROBE_UNIT)
    wants.symlink_to("/etc/systemd/system/honk-probe.service")
    try:
        # no host systemd here: no scope unit, no registration; the root's own time zone and resolver
        done = subprocess.run(
            [
                "systemd-nspawn",
                "--quiet",
                "--keep-unit",
                "--register=no",
                "--timezone=off",
                "--resolv-conf=off",
                "-D",
                str(root),
                "--boot",
            ],
            text=True,
            capture_output=True,
            timeout=120,
        )
        assert result.exists(), f"the probe did not run:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        lines = result.read_text().splitlines()
    finally:
        for path in (unit, wants, result):
            path.unlink(missing_ok=True)
    assert lines[0] == "active" and "reload=ok" in lines, lines
    started, reloaded = lines[1 : lines.index("reload=ok")], lines[lines.index("reload=ok") + 1 :]
    shown = dict(line.split("=", 1) for line in started)
    assert shown["Type"] == "notify" and shown["SubState"] == "running"
    assert shown["StatusText"] == "serving generation 1"  # honk's own READY=1 status line
    assert set(shown["CapabilityBoundingSet"].split()) == {
        "cap_net_admin",
        "cap_net_raw",
        "cap_net_bind_service",
        "cap_bpf",
    }
    assert dict(line.split("=", 1) for line in reloaded) == {
        "ActiveState": "active",
        "StatusText": "serving generation 1",
    }


def test_an_upgrade_keeps_the_edited_config_and_state_and_a_purge_leaves_nothing(root, debs) -> None:
    _, second = debs
    config, api, state = root / "etc/honk/config.dae", root / "etc/honk/api.dae", root / "var/lib/honk/mine"
    edited = config.read_text().replace("log_level: info", "log_level: debug") + "# edited by the admin\n"
    config.write_text(edited)
    state.write_text("kept")
    secret = api.read_text()
    shutil.copy(second, root / "tmp" / second.name)
    _chroot(root, "dpkg", "-i", f"/tmp/{second.name}")
    assert _chroot(root, "dpkg-query", "-W", "-f", "${Version}", "honk").stdout == UPGRADE_VERSION
    assert config.read_text() == edited and api.read_text() == secret and state.read_text() == "kept"
    assert "ok:" in _chroot(root, "honk", "check", "/etc/honk/config.dae").stdout

    _chroot(root, "apt-get", "purge", "-y", "-q", "honk")
    for gone in (
        "etc/honk",
        "var/lib/honk",
        "usr/lib/honk",
        "run/honk",
        "usr/bin/honk",
        "lib/systemd/system/honk.service",
    ):
        assert not (root / gone).exists(), gone
    for deb in (root / "tmp").glob("honk_*.deb"):
        deb.unlink()
    shutil.rmtree(root / "tmp/demo", ignore_errors=True)
    before = (root.parent / "before.txt").read_text().splitlines()
    after = _listing(root).splitlines()
    assert sorted(set(after) - set(before)) == []  # nothing honk made is left
