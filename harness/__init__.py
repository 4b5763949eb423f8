"""local-kimi: harness."""
