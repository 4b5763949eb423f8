"""local-kimi: k3."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("local-kimi")
except PackageNotFoundError:  # a source tree that was never installed
    VERSION = "unknown"
