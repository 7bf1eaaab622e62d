"""The test world's TLS server (port 443 on every test host): logs each SNI (or `-`) to
sni.log, answers `sni=<name>` and echoes after a WebSocket upgrade; for the names under
static/ it serves files from static/<name>/ instead (a package index, a registry, a git
repository over the dumb HTTP protocol). Each connection on its own thread, so a client that
never finishes its handshake blocks nobody."""
import os, socket, ssl, sys, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

ROOT = os.path.abspath("static")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("cert.pem", "cert.key")
SNI = threading.local()


def remember(sock, name, _):
    sock.airlock_sni = name


ctx.sni_callback = remember
log = open("sni.log", "a", buffering=1)


class Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_response(self, code, message=None):
        # No Server or Date header: answers stay short (clients read them in one recv).
        self.send_response_only(code, message)

    def sni(self):
        return getattr(self.connection, "airlock_sni", None) or "-"

    def static_dir(self):
        path = os.path.join(ROOT, self.sni())
        return path if self.sni() != "-" and os.path.isdir(path) else None

    def translate_path(self, path):
        base = self.static_dir()
        parts = [p for p in unquote(urlsplit(path).path).split("/") if p not in ("", ".", "..")]
        return os.path.join(base, *parts)

    def guess_type(self, path):
        # A registry's package documents have no extension.
        return "application/json" if "." not in os.path.basename(path) else super().guess_type(path)

    def end_headers(self):
        self.send_header("Connection", "close")
        self.close_connection = True
        super().end_headers()

    def do_GET(self):
        if self.static_dir():
            return super().do_GET()
        url = urlsplit(self.path)
        if url.path == "/redirect":
            # /redirect?URL: a redirect to URL, for clients that must not follow it elsewhere.
            self.send_response(302)
            self.send_header("Location", unquote(url.query))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path == "/echo":
            body = ("%s %s host=%s sni=%s\n" % (self.command, self.path, self.headers.get("Host"), self.sni())).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if "websocket" in self.headers.get("Upgrade", "").lower():
            self.connection.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            while True:
                chunk = self.connection.recv(4096)
                if not chunk:
                    return
                self.connection.sendall(chunk)
        # In one write (one TLS record): clients read the answer with one recv.
        body = ("sni=" + self.sni() + "\n").encode()
        head = "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        self.close_connection = True
        self.wfile.write(head.encode() + body)

    def do_POST(self):
        # Echoes the method, path and body size: a worker's fetch with a body.
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        body = ("%s %s %d bytes sni=%s\n" % (self.command, self.path, len(data), self.sni())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        if self.static_dir():
            return super().do_HEAD()
        self.send_error(405)


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    request_queue_size = 64

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def finish_request(self, request, client_address):
        try:
            tls = ctx.wrap_socket(request, server_side=True)
        except Exception:
            log.write("handshake-failed\n")
            return
        log.write((getattr(tls, "airlock_sni", None) or "-") + "\n")
        self.RequestHandlerClass(tls, client_address, self)


server = Server(("::", 443), Handler)
sys.stdout.write("ready\n")
sys.stdout.flush()
server.serve_forever()
