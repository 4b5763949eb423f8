"""Which checkout a harness command works on: the git top level of the current directory, or `--root`.

Never the directory the package was imported from: from a copy of the repository, or from a non-editable
install in site-packages, that would silently check another tree.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class NotACheckout(ValueError):
    """The directory is not inside a git checkout and no root was given."""


def checkout_root(start: Path | None = None) -> Path:
    """The top level of the git checkout holding `start` (default: the current directory)."""
    start = Path(start or Path.cwd()).resolve()
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=start, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotACheckout(f"cannot run git in {start} ({exc}): pass --root") from None
    if out.returncode != 0:
        raise NotACheckout(f"{start} is not inside a git checkout: run from the repository or pass --root")
    return Path(out.stdout.strip())
