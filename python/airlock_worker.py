"""Helper for airlock workers (worker protocol v1). Standard library only; copy it anywhere.

A worker runs in a job directory laid out by the host:

    in/            declared input files (read-only)
    options.json   the job's options
    out/           where results go (the only writable place besides tmp)

and reports on stdout with one JSON object per line. Use ``progress``, ``log`` and ``done``
rather than ``print``: any other stdout line is reported to the caller as an error event.
Print free-form diagnostics to stderr instead.

The job directory is ``$AIRLOCK_JOB_DIR`` if set, else the current working directory.
See docs/worker-protocol.md.
"""

import http.client
import json
import math
import os
import socket
import sys
import urllib.parse
import urllib.request

PROTOCOL_VERSION = 1
MAX_NAME_BYTES = 255

__all__ = [
    "PROTOCOL_VERSION",
    "progress",
    "log",
    "done",
    "inputs",
    "options",
    "output_path",
    "job_dir",
    "fetch",
    "Response",
    "FetchError",
    "FetchRefused",
]


def job_dir():
    """The job directory: $AIRLOCK_JOB_DIR, or the current working directory."""
    return os.environ.get("AIRLOCK_JOB_DIR") or os.getcwd()


def _emit(event):
    event = dict(event, v=PROTOCOL_VERSION)
    sys.stdout.write(json.dumps(event, allow_nan=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def progress(pct, msg=None):
    """Report that the job is ``pct`` (a number in 0..1) done, with an optional message."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)):
        raise TypeError("progress fraction must be a number, got %r" % (pct,))
    if not math.isfinite(pct) or not 0 <= pct <= 1:
        raise ValueError("progress fraction must be within 0..1, got %r" % (pct,))
    event = {"progress": float(pct)}
    if msg is not None:
        event["message"] = str(msg)
    _emit(event)


def log(msg):
    """Send a line of diagnostic text to the caller."""
    _emit({"log": str(msg)})


def done():
    """Declare the job finished: ``out/`` is complete. Exit with status 0 afterwards."""
    _emit({"done": True})


def inputs():
    """The staged inputs: a dict of file name -> path, sorted by name."""
    in_dir = os.path.join(job_dir(), "in")
    names = sorted(os.listdir(in_dir)) if os.path.isdir(in_dir) else []
    return {
        name: os.path.join(in_dir, name)
        for name in names
        if os.path.isfile(os.path.join(in_dir, name))
    }


def options():
    """The job's options, parsed from options.json."""
    with open(os.path.join(job_dir(), "options.json"), encoding="utf-8") as handle:
        return json.load(handle)


def name_problem(name):
    """Why ``name`` is not a valid single file name, or None. Mirrors the host's rule."""
    if not isinstance(name, str):
        return "name is not a string"
    if name == "":
        return "name is empty"
    if name in (".", ".."):
        return "name is a directory reference"
    if "/" in name:
        return "name contains '/'"
    if "\0" in name:
        return "name contains a NUL byte"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "name contains a control character"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if len(encoded) > MAX_NAME_BYTES:
        return "name is too long"
    return None


def output_path(name):
    """Path of ``out/<name>``; ``name`` must be a single plain file name (no '/', no '..')."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError("invalid output name %r: %s" % (name, problem))
    return os.path.join(job_dir(), "out", name)


# ---------------------------------------------------------------------------------------------
# fetch: HTTP(S) through airlock's egress gate, under the worker's allowlist.
# ---------------------------------------------------------------------------------------------

MAX_REDIRECTS = 5
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """A fetch that could not complete: no connection, a cross-origin redirect, too large."""


class FetchRefused(FetchError):
    """The egress gate refused the request; ``reason`` is its word for why (``not_allowed``,
    ``non_public_address``, ``sni_mismatch``, ``limit:bytes_out``, ...)."""

    def __init__(self, url, reason):
        super().__init__("%s refused by the egress gate: %s" % (url, reason))
        self.url = url
        self.reason = reason


class Response:
    """A finished HTTP exchange: ``status``, ``headers`` (lower-case names), ``body`` (bytes)
    and the final ``url`` (after same-origin redirects)."""

    def __init__(self, url, status, headers, body):
        self.url = url
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def ok(self):
        return 200 <= self.status < 300

    def text(self, encoding="utf-8"):
        return self.body.decode(encoding, errors="replace")

    def json(self):
        return json.loads(self.body)


def _origin(url):
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.scheme, (parts.hostname or "").lower(), parts.port or default)


def _proxy_for(parts):
    """The proxy endpoint (host, port) for this URL from the environment, if any."""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    endpoint = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    return (endpoint.hostname, endpoint.port or 80)


def _read_head(sock):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
        if len(head) > 65536:
            break
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    return lines[0], {name.strip().lower(): value.strip() for name, value in headers.items()}


class _TunnelledHTTPS(http.client.HTTPSConnection):
    """HTTPS through an HTTP CONNECT proxy, reading the proxy's refusal (http.client's own
    tunnel keeps only the status line)."""

    def __init__(self, host, port, proxy, url, **kwargs):
        super().__init__(host, port, **kwargs)
        self._proxy = proxy
        self._url = url

    def connect(self):
        sock = socket.create_connection(self._proxy, self.timeout)
        authority = "%s:%d" % (self.host, self.port)
        sock.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)).encode())
        status, headers = _read_head(sock)
        if status.split(" ")[1:2] != ["200"]:
            sock.close()
            raise FetchRefused(self._url, headers.get("x-airlock-egress") or status)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _connection(url, timeout):
    """The connection for one request, and the request target (absolute through a proxy)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = _proxy_for(parts)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    if parts.scheme == "https" and proxy:
        return _TunnelledHTTPS(parts.hostname, port, proxy, url, timeout=timeout), target
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, port, timeout=timeout), target
    if proxy:
        absolute = urllib.parse.urlunsplit(("http", parts.netloc, parts.path or "/", parts.query, ""))
        return http.client.HTTPConnection(proxy[0], proxy[1], timeout=timeout), absolute
    return http.client.HTTPConnection(parts.hostname, port, timeout=timeout), target


def _exchange(url, method, headers, data, timeout, max_bytes):
    connection, target = _connection(url, timeout)
    parts = urllib.parse.urlsplit(url)
    try:
        connection.request(method, target, body=data, headers=dict(headers, Host=parts.netloc))
        answer = connection.getresponse()
        refused = answer.getheader("X-Airlock-Egress")
        if refused:
            raise FetchRefused(url, refused)
        content = answer.read(max_bytes + 1)
    except (OSError, http.client.HTTPException) as error:
        raise FetchError("%s: %s" % (url, error)) from None
    finally:
        connection.close()
    if len(content) > max_bytes:
        raise FetchError("%s: the body is larger than %d bytes" % (url, max_bytes))
    names = {name.lower(): value for name, value in answer.getheaders()}
    return Response(url, answer.status, names, content)


def fetch(url, method="GET", headers=None, body=None, timeout=30.0, max_bytes=DEFAULT_MAX_BYTES):
    """Fetches ``url`` (http or https) through the egress gate: the request leaves the sandbox
    only if the worker's allowlist allows it, and a redirect is followed only within the same
    origin (scheme, host and port). HTTP error statuses come back as a Response; a refusal by
    the gate raises FetchRefused, and a failed connection, a cross-origin redirect or a body
    over ``max_bytes`` raise FetchError. ``body`` is bytes or str; ``headers`` a dict. Server
    certificates are checked against the system's CAs (or ``SSL_CERT_FILE``)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise FetchError("only http and https URLs can be fetched: %r" % (url,))
    data = body.encode("utf-8") if isinstance(body, str) else body
    method, headers = method.upper(), dict(headers or {})
    for _ in range(MAX_REDIRECTS + 1):
        response = _exchange(url, method, headers, data, timeout, max_bytes)
        location = response.headers.get("location")
        if response.status not in REDIRECTS or not location:
            return response
        target = urllib.parse.urljoin(url, location)
        if _origin(target) != _origin(url):
            raise FetchError("redirect from %s to another origin refused: %s" % (url, target))
        if response.status == 303 or (response.status in (301, 302) and method == "POST"):
            method, data = "GET", None
        url = target
    raise FetchError("%s: more than %d redirects" % (url, MAX_REDIRECTS))
