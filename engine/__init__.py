"""local-kimi: engine."""
