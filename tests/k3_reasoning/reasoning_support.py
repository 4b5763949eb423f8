"""Helpers shared by the k3.reasoning tests."""


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_record(
    text: str = "Checking.", reasoning: str = "think hard", arguments: str = '{"city":  "Paris" }'
) -> dict:
    return {
        "content": text,
        "reasoning": reasoning,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }
