"""The bottom layer: small helpers that both k3 and the engine use. Imports nothing from the project."""
