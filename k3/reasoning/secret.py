"""The per-install signing secret, kept next to the ledger (private: see k3.reasoning.private)."""

from __future__ import annotations

import contextlib
import os
import secrets

from k3.reasoning.private import check_private_dir, check_private_file, open_no_follow

SECRET_NAME = "k3-signing.key"
SECRET_BYTES = 32


def load_or_create_secret(directory: str) -> bytes:
    """Read `<directory>/k3-signing.key`, creating it (mode 0600, directory 0700) if missing.

    Creation is atomic (write a private temp file, then hard-link it into place), so processes
    starting together agree on one secret. Refuses (`UnsafeStateError`) a directory others can
    write, a key others can read, or a key that is a symlink.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    check_private_dir(directory)
    path = os.path.join(directory, SECRET_NAME)
    if not os.path.lexists(path):
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(SECRET_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileExistsError):  # another process won the race: use its
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    fd = open_no_follow(path)
    with os.fdopen(fd, "rb") as handle:
        check_private_file(fd, path, "delete it (k3 mints a new key; signatures given so far stop verifying)")
        secret = handle.read()
    if len(secret) < SECRET_BYTES:
        raise ValueError(f"{path} is truncated ({len(secret)} bytes); delete it to mint a new secret")
    return secret
