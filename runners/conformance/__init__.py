"""The conformance suite: real coding agents through k3 against a scripted engine.

    python -m runners.conformance install      pinned clients into .cache/clients/
    python -m runners.conformance run          every client x scenario; receipt + docs/CLIENTS.md
    python -m runners.conformance docs         docs/CLIENTS.md from the newest receipt

Modules: `install` (npm/PyPI pins), `upstream` (the scripted engine), `tap` (records what clients
send to k3), `k3proc` (k3 as a child process), `clients` (how each client is set up, run and read),
`scenarios` (scripts and checks), `driver` (one run), `report` (receipt and docs).
"""
