"""The node-wide lock every prepare and unprepare holds (``docs/checkpoint.md``, "Two phases").

A thread lock, then ``flock`` on the lock file, then on its directory. Two plugin pods of
one node (a rolling update) take turns through it; a claim waits at most ``timeout_s`` and
then fails with a retryable error, which the kubelet retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from driver.errors import RetryableError

log = logging.getLogger(__name__)


class NodeLock:
    """The lock of the node whose lock file is ``path``."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The node-wide lock: a thread lock, then ``flock`` on the lock file, then on its
        directory. The file is what plugins before 2026-12-05 lock, so a rolling update from
        one stays exclusive; the directory keeps the lock whole when the file is deleted while
        held (a process opening the path then makes and locks a new file)."""
        deadline = time.monotonic() + self.timeout_s
        if not self._thread_lock.acquire(timeout=self.timeout_s):
            raise RetryableError(f"lock {self.path}: busy for {self.timeout_s}s")
        try:
            fd = self._lock_file(deadline)
            try:
                directory = self._lock_directory(deadline)
                try:
                    yield
                finally:
                    os.close(directory)
            finally:
                os.close(fd)
        finally:
            self._thread_lock.release()

    def _lock_directory(self, deadline: float) -> int:
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._flock(fd, deadline, self.path.parent)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_lock_file(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # its directory is not there (yet, or any more)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def _lock_file(self, deadline: float) -> int:
        """An open ``fd`` of the file the lock path names, ``flock``-ed. A file deleted or
        replaced while this process waited for it is let go and the path opened again: a
        process opening the path now would lock the new file, not the one locked here."""
        while True:
            fd = self._open_lock_file()
            try:
                self._flock(fd, deadline, self.path)
                if _names(self.path, fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            log.info("lock file replaced while waiting for it path=%s; locking again", self.path)
            if time.monotonic() > deadline:
                raise RetryableError(
                    f"lock {self.path}: replaced while waiting for {self.timeout_s}s"
                )

    def _flock(self, fd: int, deadline: float, path: Path) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError as e:
                if time.monotonic() > deadline:
                    raise RetryableError(
                        f"lock {path}: held by another process for {self.timeout_s}s"
                    ) from e
                time.sleep(0.05)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (same device and inode)."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
