#!/usr/bin/env python3
"""Regenerate every figure in docs/figures/ (PNG, PDF and the JSON data) from the receipts in results/.

The same code as `kimi-harness figures`, run on the checkout this script belongs to, whether or not the
package is installed. USE_TEX=1 renders the text through LaTeX (needs a TeX install); otherwise Computer
Modern via matplotlib's mathtext. Extra arguments go to the command (see --help).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's harness, not another installed copy

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["figures", "--root", str(ROOT), *sys.argv[1:]], prog_name="make_figures.py")
