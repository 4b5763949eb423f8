"""local-kimi: k3."""
