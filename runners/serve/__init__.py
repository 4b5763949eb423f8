"""`python -m runners serve`: the serving benchmark of any streaming endpoint in three dialects.

dialects.py  routes, request bodies and what each streamed event carries, per dialect
client.py    one streamed turn, timed at every event
metrics.py   TTFT / ITL / TPOT / E2E of a turn; a level's throughput and goodput
datasets.py  random prompts, coding-agent traces, a JSONL file
load.py      the driver: concurrency (closed loop) and/or request rate (open loop), warm-up
receipts.py  one receipt per (endpoint, dialect, level)
side_by_side.py  our engine and llama-server on the same weights, each directly and through k3
cli.py       the command
"""
