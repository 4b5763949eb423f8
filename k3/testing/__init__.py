"""Test and benchmark helpers that ship with k3: a scripted fake engine and a streaming ASGI transport."""
