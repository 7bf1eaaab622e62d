"""Files of a session's workspace, read and written while sandboxed programs may be changing
the same tree.

A program can plant ``report.json -> /etc/shadow`` or hardlink a file it can see, or swap a
directory for a symlink between two calls. So nothing here goes through a path: each
component is opened relative to its parent's descriptor with ``O_NOFOLLOW``; a file is read
only if it is a regular file with one link, through the descriptor that was checked; a write
goes to a fresh temporary name, then ``rename`` replaces the target (a symlink there is
replaced itself, never followed).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx

from airlock import _daemon
from airlock._cli import AirlockError

#: Largest file read by default.
DEFAULT_MAX_BYTES = 64 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class WorkspaceError(AirlockError):
    """A file operation was refused or failed; ``reason`` says why in one word."""

    def __init__(self, path: str, reason: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = reason


def components(path: str | os.PathLike[str]) -> list[str]:
    """The parts of a path relative to the workspace, or why it is refused."""
    text = os.fspath(path)
    if not text or "\0" in text or len(text.encode()) > 4096:
        raise WorkspaceError(text, "invalid", "give a relative path of 1 to 4096 bytes")
    if text.startswith("/"):
        raise WorkspaceError(text, "outside_workspace", "absolute paths are outside it")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspaceError(text, "outside_workspace", "`..` leads out of the workspace")
    if not parts or len(parts) > 32 or any(len(p.encode()) > 255 for p in parts):
        raise WorkspaceError(text, "invalid", "no name, too deep, or a name over 255 bytes")
    return parts


def _failure(path: str, err: OSError) -> WorkspaceError:
    if err.errno == errno.ENOENT:
        return WorkspaceError(path, "not_found", "no such file")
    if err.errno == errno.ELOOP:
        return WorkspaceError(path, "symlink", "a symbolic link is never followed")
    return WorkspaceError(path, "error", os.strerror(err.errno or errno.EIO))


class Files:
    """``files.write``/``files.read`` of a session: paths are relative to its workspace."""

    def __init__(self, root: Path, owner: tuple[int, int] | None) -> None:
        self.root = root
        self._owner = owner

    @contextlib.contextmanager
    def _parent(self, path: str, parts: list[str], create: bool) -> Iterator[int]:
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for name in parts[:-1]:
                child = self._enter(fd, name, path, create)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _enter(self, parent: int, name: str, path: str, create: bool) -> int:
        """Opens directory ``name`` below ``parent`` (left open) without following a link."""
        try:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=parent)
                child = os.open(name, _DIR_FLAGS, dir_fd=parent)
                self._give(child)
            except NotADirectoryError:
                # O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR: name it as a symlink.
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ELOOP, "symlink") from None
                raise
        except OSError as err:
            raise _failure(path, err) from None
        return child

    def _give(self, fd: int) -> None:
        if self._owner is not None:
            os.fchown(fd, *self._owner)

    def read(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        """The bytes of a regular file with one link, at most ``max_bytes`` of them."""
        text = os.fspath(path)
        parts = components(text)
        with self._parent(text, parts, create=False) as parent:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(parts[-1], flags, dir_fd=parent)
            except OSError as err:
                raise _failure(text, err) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise WorkspaceError(text, "not_a_regular_file", "only regular files are read")
            if st.st_nlink != 1:
                raise WorkspaceError(text, "hardlink", "several links: it may be a host file")
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise WorkspaceError(text, "too_large", f"larger than {max_bytes} bytes")
        return data

    def read_text(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str | os.PathLike[str], data: bytes | str) -> int:
        """Creates or replaces a file (and missing directories); returns its size."""
        text = os.fspath(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        parts = components(text)
        with self._parent(text, parts, create=True) as parent:
            temp = f".airlock-upload-{secrets.token_hex(8)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(temp, flags, 0o644, dir_fd=parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
                    self._give(f.fileno())
                os.rename(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                raise _failure(text, err) from None
        return len(payload)

    def list(self, path: str | os.PathLike[str] = ".") -> list[str]:
        """Names in a directory of the workspace (``"."``: the top), sorted."""
        text = os.fspath(path)
        if text in (".", ""):
            fd = os.open(self.root, _DIR_FLAGS)
        else:
            parts = components(text)
            with self._parent(text, [*parts, "_"], create=False) as parent:
                fd = self._enter(parent, parts[-1], text, create=False)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)


def _remote_reason(status_code: int, kind: str, fix: str) -> str:
    """The local ``WorkspaceError.reason`` for a daemon's answer about a workspace file."""
    if status_code == 403:
        return "hardlink" if "linking" in fix else "symlink"
    return {
        "bad_request": "invalid",
        "not_a_file": "not_a_regular_file",
        "changed_during_read": "changed",
    }.get(kind, kind)


class RemoteFiles:
    """:class:`Files` of a session held by airlockd: the daemon opens each path beneath the
    workspace without following links (``openat2``), and refuses hardlinked files."""

    def __init__(self, daemon: _daemon.Daemon, session_id: str) -> None:
        self._daemon = daemon
        self._base = f"/v1/sessions/{quote(session_id, safe='')}/files"

    def _url(self, text: str) -> str:
        if text in (".", ""):
            return self._base
        return self._base + "/" + "/".join(quote(p, safe="") for p in components(text))

    def _request(self, method: str, text: str, content: bytes | None = None) -> httpx.Response:
        try:
            with self._daemon.client() as client:
                response = client.request(method, self._url(text), content=content)
        except httpx.HTTPError as e:
            raise _daemon.unreachable(self._daemon, e) from e
        return _checked(response, text)

    def read(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        text = os.fspath(path)
        return _content(self._request("GET", text), text, max_bytes)

    def read_text(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str | os.PathLike[str], data: bytes | str) -> int:
        payload = data.encode() if isinstance(data, str) else bytes(data)
        self._request("PUT", os.fspath(path), payload)
        return len(payload)

    def list(self, path: str | os.PathLike[str] = ".") -> list[str]:
        text = os.fspath(path)
        return _names(self._request("GET", text), text)

    def remove(self, path: str | os.PathLike[str]) -> None:
        """Removes a file or an empty directory."""
        self._request("DELETE", os.fspath(path))


def _checked(response: httpx.Response, text: str) -> httpx.Response:
    if response.status_code >= 400:
        error = _daemon.daemon_error(response)
        reason = _remote_reason(response.status_code, error.kind, error.fix)
        raise WorkspaceError(text, reason, error.message)
    return response


def _content(response: httpx.Response, text: str, max_bytes: int) -> bytes:
    if response.headers.get("content-type", "").startswith("application/json"):
        raise WorkspaceError(text, "not_a_regular_file", "a directory: list it instead")
    if len(response.content) > max_bytes:
        raise WorkspaceError(text, "too_large", f"larger than {max_bytes} bytes")
    return response.content


def _names(response: httpx.Response, text: str) -> list[str]:
    listing = response.json()
    if not isinstance(listing, dict) or "entries" not in listing:
        raise WorkspaceError(text, "not_a_directory", "a file: read it instead")
    return sorted(str(entry["name"]) for entry in listing["entries"])


class AsyncFiles:
    """The files of an :class:`~airlock.AsyncSession` for asyncio, with the same refusals as
    :class:`Files`: in daemon mode each call is a request on an ``httpx.AsyncClient``; in
    local mode the descriptor-walking :class:`Files` runs in a worker thread."""

    def __init__(self, files: Files | RemoteFiles) -> None:
        self._files = files

    async def _request(
        self, remote: RemoteFiles, method: str, text: str, content: bytes | None = None
    ) -> httpx.Response:
        daemon = remote._daemon
        try:
            async with daemon.async_client() as client:
                response = await client.request(method, remote._url(text), content=content)
        except httpx.HTTPError as e:
            raise _daemon.unreachable(daemon, e) from e
        return _checked(response, text)

    async def read(
        self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> bytes:
        text = os.fspath(path)
        if isinstance(self._files, RemoteFiles):
            return _content(await self._request(self._files, "GET", text), text, max_bytes)
        return await asyncio.to_thread(self._files.read, text, max_bytes=max_bytes)

    async def read_text(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str | os.PathLike[str], data: bytes | str) -> int:
        text = os.fspath(path)
        if isinstance(self._files, RemoteFiles):
            payload = data.encode() if isinstance(data, str) else bytes(data)
            await self._request(self._files, "PUT", text, payload)
            return len(payload)
        return await asyncio.to_thread(self._files.write, text, data)

    async def list(self, path: str | os.PathLike[str] = ".") -> list[str]:
        text = os.fspath(path)
        if isinstance(self._files, RemoteFiles):
            return _names(await self._request(self._files, "GET", text), text)
        return await asyncio.to_thread(self._files.list, text)
