from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[3] / "../shared/traces"
TRACE_FILES = ("mooncake_conversation.jsonl", "azure_llm_2023_code.csv", "azure_llm_2023_conv.csv")


@pytest.fixture
def traces() -> Path:
    if not (TRACES / TRACE_FILES[0]).is_file():
        pytest.skip(f"shared traces not found at {TRACES.resolve()}")
    return TRACES
