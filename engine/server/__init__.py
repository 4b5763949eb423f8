"""The OpenAI-compatible HTTP server (`kimi-engine serve`) over the runtime's scheduler."""
