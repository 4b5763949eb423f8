"""local-kimi: runners."""
