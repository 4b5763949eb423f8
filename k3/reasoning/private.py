"""Checks that k3's state (the signing key, the ledger) is private to the user running k3.

Policy: refuse, never repair. A state directory others can write to may already hold a key they
planted; a key others can read may already be copied (anyone holding it can forge reasoning
signatures); a ledger others can read has leaked conversations. Quietly chmod-ing would hide
that, so k3 stops with an `UnsafeStateError` that names the file and the command that fixes it
(or, for a key, says to delete it and let k3 mint a new one). The key file is opened without
following symlinks. POSIX only: on Windows the ACLs are the user's business.
"""

from __future__ import annotations

import os
import stat

_CHECKED = os.name == "posix"


class UnsafeStateError(ValueError):
    """A state file or directory other users could read or write."""


def check_private_dir(path: str) -> None:
    """Refuse a state directory owned by someone else or writable by group or others."""
    if not _CHECKED:
        return
    info = os.stat(path)
    if info.st_uid != os.geteuid():
        raise UnsafeStateError(f"state directory {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStateError(
            f"state directory {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run: chmod 700 {path}"
        )


def check_private_file(fd: int, path: str, fix: str) -> None:
    """Refuse an open state file that is not a regular file of ours, or that group or others can
    read or write. `fix` says what to do about loose permissions."""
    if not _CHECKED:
        return
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeStateError(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise UnsafeStateError(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        raise UnsafeStateError(f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); {fix}")


def open_no_follow(path: str) -> int:
    """A read-only descriptor of `path`, refusing a symlink (`UnsafeStateError`)."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        if os.path.islink(path):
            raise UnsafeStateError(
                f"{path} is a symlink; k3 does not follow links to its signing key"
            ) from None
        raise
