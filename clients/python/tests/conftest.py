"""Shared fixtures: world-readable scratch, the fixture tool modules, and a real airlockd on a
temporary Unix socket for the tests that run in both modes (``mode``)."""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airlock import _cli

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the sandbox user can read (pytest's tmp_path is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="airlock-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tools_dir() -> Iterator[Path]:
    """The fixture tool modules, copied where the sandbox user can read them and importable."""
    path = Path(tempfile.mkdtemp(prefix="airlock-tools-"))
    path.chmod(0o755)
    for module in ("tutor_tools.py", "decorated_tools.py"):
        shutil.copy(FIXTURES / module, path / module)
        os.chmod(path / module, 0o644)
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))
    shutil.rmtree(path, ignore_errors=True)


# --- A real airlockd on a temporary Unix socket (daemon mode) ------------------------------


def _airlockd_binary() -> str | None:
    """``$AIRLOCKD_BIN``, else ``airlockd`` next to the airlock binary, else on PATH."""
    if os.environ.get("AIRLOCKD_BIN"):
        return os.environ["AIRLOCKD_BIN"]
    beside = Path(_cli.find_binary("airlock")).with_name("airlockd")
    if beside.is_file():
        return str(beside)
    return shutil.which("airlockd")


def _new_key() -> tuple[str, str]:
    """A key as airlockd makes them (``alk_`` + 32 random bytes) and its configuration hash."""
    key = "alk_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return key, "sha256:" + hashlib.sha256(key.encode()).hexdigest()


#: The tenant of the tests: the ceiling allows allowlists under example.com, not the host's
#: network (a request for it is a typed `ceiling` refusal); its toolset is the fixture tools.
_CONFIG = """\
[server]
socket = "{root}/run/airlockd.sock"
listen = ["{tls_listen}"]
tls_cert = "{root}/tls/cert.pem"
tls_key = "{root}/tls/key.pem"
max_wait = "60s"
shutdown_grace = "3s"
stream_keepalive = "1s"

[paths]
state_dir = "{root}/state"
runtime_dir = "{root}/run"
init_program = "{airlock}"

[pool]
max_concurrent = 4
max_queued = 50
queue_timeout = "60s"

[sessions]
max_per_tenant = 8

[sandbox]
cgroup_parent = "{cgroup_parent}"

[toolsets.tutor]
path = "{tools}"

[[tenants]]
name = "pytest"
keys = [{{ name = "pytest", hash = "{hash}" }}]
toolsets = ["tutor"]
[tenants.ceiling]
network = "allowlist"
allowlist = ["**.example.com"]
min_isolation = "process"
memory = "1GiB"
wall_time = "10m"

[[tenants]]
name = "other"
keys = [{{ name = "other", hash = "{other_hash}" }}]
"""


@dataclass
class Airlockd:
    """A started airlockd: its Unix socket, its TLS listener on loopback, and the key."""

    root: Path
    socket: Path
    key: str
    proc: subprocess.Popen[bytes]
    cgroup_parent: str
    tls_listen: str
    #: A key of another tenant, to check that tenants cannot reach each other's things.
    other_key: str = ""

    @property
    def https_url(self) -> str:
        return f"https://{self.tls_listen}"

    @property
    def ca_file(self) -> Path:
        """The daemon's self-signed certificate, to trust (``SSL_CERT_FILE``)."""
        return self.root / "tls" / "cert.pem"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def log(self) -> str:
        return (self.root / "daemon.log").read_text(errors="replace")


def _self_signed(directory: Path) -> None:
    """A certificate for 127.0.0.1 (valid one day) and its key, for the TLS listener."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "airlockd test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(mode=0o700)
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_airlockd(binary: str, tools: Path) -> Airlockd:
    root = Path(tempfile.mkdtemp(prefix="airlockd-py-"))
    root.chmod(0o755)
    _self_signed(root / "tls")
    tls_listen = f"127.0.0.1:{_free_port()}"
    key, hashed = _new_key()
    other_key, other_hash = _new_key()
    cgroup_parent = root.name.replace(".", "-")
    config = root / "airlockd.toml"
    config.write_text(
        _CONFIG.format(
            root=root,
            airlock=_cli.find_binary("airlock"),
            hash=hashed,
            other_hash=other_hash,
            cgroup_parent=cgroup_parent,
            tools=tools,
            tls_listen=tls_listen,
        )
    )
    with open(root / "daemon.log", "ab") as log:
        proc = subprocess.Popen(
            [binary, "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "AIRLOCKD_LOG": "info"},
        )
    daemon = Airlockd(
        root, root / "run" / "airlockd.sock", key, proc, cgroup_parent, tls_listen, other_key
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.connect(str(daemon.socket))
            return daemon
        time.sleep(0.05)
    text = daemon.log()
    left = _stop_airlockd(daemon)  # removes the test's directory too
    raise RuntimeError(f"airlockd did not start ({proc.returncode}; left {left}):\n{text}")


def _leftovers(daemon: Airlockd) -> list[str]:
    """What a stopped daemon left: mounts under its directories, its cgroups, processes."""
    found = []
    with open("/proc/self/mounts") as mounts:
        found += [m.split()[1] for m in mounts if m.split()[1].startswith(str(daemon.root))]
    for controller in Path("/sys/fs/cgroup").iterdir():
        found += [str(p) for p in controller.glob(f"**/{daemon.cgroup_parent}") if p.is_dir()]
    pgrep = subprocess.run(["pgrep", "-f", str(daemon.root)], capture_output=True, text=True)
    found += [f"process {pid}" for pid in pgrep.stdout.split()]
    return found


def _stop_airlockd(daemon: Airlockd) -> list[str]:
    """Stops the daemon (SIGTERM: its runs end, its listeners close) and returns what it left
    behind; then removes the test's directory either way."""
    _cli.stop(daemon.proc)
    # The daemon's own cgroup parent (an empty directory per controller) is its to remove
    # only while it runs; an empty one left is removed here, anything else is reported.
    for controller in Path("/sys/fs/cgroup").iterdir():
        for parent in controller.glob(f"**/{daemon.cgroup_parent}"):
            with contextlib.suppress(OSError):
                parent.rmdir()
    left = _leftovers(daemon)
    shutil.rmtree(daemon.root, ignore_errors=True)
    return left


@pytest.fixture(scope="session")
def airlockd(tools_dir: Path) -> Iterator[Airlockd]:
    binary = _airlockd_binary()
    if binary is None:
        pytest.skip(
            "no airlockd binary (set AIRLOCKD_BIN, or build it next to airlock: "
            "cargo build --release -p airlockd)"
        )
    daemon = _start_airlockd(binary, tools_dir)
    yield daemon
    left = _stop_airlockd(daemon)
    assert not left, f"airlockd left behind: {left}"
    assert not daemon.root.exists()


@dataclass(frozen=True)
class Mode:
    """How a test's sandboxes reach airlock: ``local`` (the CLI) or ``daemon`` (airlockd)."""

    name: str
    url: str
    api_key: str | None = None

    @property
    def kw(self) -> dict[str, Any]:
        return {"url": self.url, "api_key": self.api_key}


@pytest.fixture(params=["local", "daemon"])
def mode(request: pytest.FixtureRequest) -> Mode:
    if request.param == "local":
        return Mode("local", "local")
    daemon: Airlockd = request.getfixturevalue("airlockd")
    return Mode("daemon", daemon.url, daemon.key)
