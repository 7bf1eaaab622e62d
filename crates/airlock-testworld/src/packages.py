"""Builds what the test world's TLS server serves under static/: a package index with one
wheel (pypi.test), an npm registry with one package (registry.test) and a git repository over
the dumb HTTP protocol (gitsrv.test). Standard library and /usr/bin/git only."""
import base64, hashlib, io, json, os, subprocess, tarfile, tempfile, zipfile

STATIC = os.path.abspath("static")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())


def wheel():
    files = {
        "demo_pkg/__init__.py": b'VALUE = "demo-pkg from the test index"\n',
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("demo_pkg-1.0.dist-info/RECORD,,")
    files["demo_pkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    data = buffer.getvalue()
    name = "demo_pkg-1.0-py3-none-any.whl"
    root = os.path.join(STATIC, "pypi.test")
    write(os.path.join(root, "files", name), data)
    link = f'<a href="../../files/{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>'
    write(os.path.join(root, "simple", "demo-pkg", "index.html"), f"<html><body>{link}</body></html>\n")
    write(os.path.join(root, "simple", "index.html"), '<html><body><a href="demo-pkg/">demo-pkg</a></body></html>\n')


def npm_package():
    files = {
        "package/package.json": json.dumps({"name": "demo-pkg", "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": b'module.exports = "demo-pkg from the test registry";\n',
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    root = os.path.join(STATIC, "registry.test")
    write(os.path.join(root, "tarballs", "demo-pkg-1.0.0.tgz"), data)
    version = {
        "name": "demo-pkg",
        "version": "1.0.0",
        "main": "index.js",
        "dist": {
            "tarball": "https://registry.test/tarballs/demo-pkg-1.0.0.tgz",
            "shasum": hashlib.sha1(data).hexdigest(),
            "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
        },
    }
    packument = {"name": "demo-pkg", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
    write(os.path.join(root, "demo-pkg"), json.dumps(packument))


def git_repository():
    bare = os.path.join(STATIC, "gitsrv.test", "demo.git")
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@test",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@test")
    git = lambda *args, cwd=None: subprocess.run(["/usr/bin/git", *args], cwd=cwd, env=env, check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as home:
        env["HOME"] = home
        git("init", "-q", "--bare", bare)
        work = os.path.join(home, "work")
        git("init", "-q", work)
        write(os.path.join(work, "README"), "demo repository of the test git server\n")
        git("add", "README", cwd=work)
        git("commit", "-q", "-m", "first", cwd=work)
        git("push", "-q", bare, "HEAD:refs/heads/main", cwd=work)
    git("--git-dir", bare, "symbolic-ref", "HEAD", "refs/heads/main")
    git("--git-dir", bare, "update-server-info")


wheel()
npm_package()
git_repository()
