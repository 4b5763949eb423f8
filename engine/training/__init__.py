"""Training the engine's own Kimi-Linear on this machine: corpus (stdlib source), trainer, `kimi-engine train`."""
