"""The lock on an output folder: `.OUT.lock` beside OUT (it must not move with OUT when the folders are swapped), held
with fcntl.flock for the whole run, the writer's pid inside for the message a second run prints.
The kernel drops a flock when its process dies, so a lock file left by a killed run is free and
the next run takes it over; the file is unlinked on release, and a run that locked a file that
was unlinked meanwhile retries on the new one. Without fcntl (Windows) the file is created with
O_EXCL and a lock whose pid is no longer running is taken over. A run that finds OUT existing
(before it locks) probes the lock first: when another run holds it, the message is "in use by
another headscope run", not "already exists" (the loser of two runs started together). A lock
file that cannot be written (a full disk) is unlinked before the one-line OutputError.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from headscope.errors import OutputError, OutputLockedError

log = logging.getLogger(__name__)


def os_reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return False
    return True


# ---- the lock ------------------------------------------------------------------------------------
def lock_path(out: Path) -> Path:
    """`.NAME.lock` beside the real folder (a symlinked OUT locks its target's name)."""
    out = Path(out)
    real = out.resolve() if out.is_symlink() else out.parent.resolve() / out.name
    return real.parent / f".{real.name}.lock"


class OutputLock:
    """An exclusive lock on an output folder; `acquire` fails at once when another run holds it."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.path = lock_path(self.out)
        self._fd: int | None = None

    def _busy(self, holder: str) -> OutputLockedError:
        who = f" (pid {holder})" if holder else ""
        return OutputLockedError(
            f"Output folder {str(self.out)!r} is in use by another headscope run{who}; "
            f"wait for it to finish or choose another --out (lock: {str(self.path)!r})."
        )

    def _uncreatable(self, err: OSError) -> OutputError:
        return OutputError(f"Cannot create the lock file {str(self.path)!r}: {os_reason(err)}; choose a writable --out.")

    def _read_holder(self) -> str:
        try:
            return self.path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return ""

    def acquire(self) -> OutputLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self._acquire_exclusive_create()
        for _ in range(100):
            try:  # never through a link: a planted .OUT.lock -> a file of yours is refused, not truncated
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP or self.path.is_symlink():
                    raise OutputError(f"The lock file {str(self.path)!r} is a symbolic link; headscope writes no file "
                                      f"through a link: remove it, or choose another --out.") from None
                raise self._uncreatable(err) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted at the lock's name
                os.close(fd)
                raise OutputError(f"The lock file {str(self.path)!r} is not a regular file; remove it, or choose "
                                  f"another --out.")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise self._busy(self._read_holder()) from None
                raise OutputError(f"Cannot lock {str(self.path)!r}: {os_reason(err)}.") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder unlinked it while we waited: lock the new file instead
                os.close(fd)
                continue
            stale = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            if stale:
                log.info("taking over the lock of a run that ended without releasing it (pid %s)", stale)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as err:  # a full disk (ENOSPC, EDQUOT): no lock file is left behind
                self.path.unlink(missing_ok=True)  # (still held: see the inode check above)
                os.close(fd)
                raise OutputError(f"Cannot write the lock file {str(self.path)!r}: {os_reason(err)}; "
                                  f"free some space or choose another --out.") from None
            self._fd = fd
            return self
        raise self._busy("")  # pragma: no cover - 100 unlink races in a row

    def held_elsewhere(self) -> bool:
        """Whether another run holds this lock now (probed without creating the file)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            holder = self._read_holder()
            return holder.isdigit() and _pid_alive(int(holder))
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        finally:
            os.close(fd)  # (closing drops the probe's shared lock)
        return False

    def _acquire_exclusive_create(self) -> OutputLock:  # pragma: no cover - without fcntl
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._read_holder()
                if holder.isdigit() and _pid_alive(int(holder)):
                    raise self._busy(holder) from None
                log.info("removing a stale lock (pid %s is not running)", holder or "unknown")
                self.path.unlink(missing_ok=True)
                continue
            except OSError as err:
                raise self._uncreatable(err) from None
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return self
        raise self._busy(self._read_holder())

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it (see acquire's inode check)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
