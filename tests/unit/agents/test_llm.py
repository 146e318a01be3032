"""The LLM coder over real HTTP (the `openai` client against a local server replaying recorded
replies): SEARCH/REPLACE and full-file replies, a failed SEARCH fed back next round, the last
verdict fed into the next prompt, and clear errors for bad configuration."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest
from replay_server import ReplayServer

from athanor.agents import AgentContext, AgentError, AgentsConfig, Board, LLMConfig, make_agents
from athanor.agents.llm import LLMCoder
from athanor.errors import ConfigError
from athanor.store import Store

KEY_ENV = "ATHANOR_TEST_LLM_KEY"


@pytest.fixture
def llm_config(monkeypatch: pytest.MonkeyPatch) -> LLMConfig:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    return LLMConfig(model="coder-7b", api_key_env=KEY_ENV, max_retries=0, timeout_s=10)


def test_search_replace_and_full_file_replies(llm_config: LLMConfig, context: AgentContext, board: Board) -> None:
    with ReplayServer(["search_replace.json", "full_file.json"]) as server:
        agent = LLMCoder(replace(llm_config, base_url=server.base_url), board=board)
        (first,) = agent.propose(context)
        (second,) = agent.propose(context)
    assert first.description == "fuse the Q, K and V projections into one matmul"
    assert "layer.qkv_proj(hidden).split(layer.qkv_sizes, dim=-1)" in first.source
    assert "layer.fuse_qkv()" in first.source and "layer.q_proj" not in first.source
    assert first.parent_id == context.incumbent_id and first.author == "llm"
    assert "torch.compile(self._decode" in second.source
    # The request: the configured model, the key, the whole source and the context, expert prompt.
    request = server.requests[0]
    assert request["model"] == "coder-7b" and server.headers[0]["authorization"] == "Bearer sk-test-123"
    system, user = request["messages"][0]["content"], request["messages"][1]["content"]
    assert "cheating is detected" in system and "SEARCH" in system
    assert context.incumbent_source.strip() in user and "aten::mm  61.2%" in user and "chat: prompt p50 512" in user
    assert [p.kind for p in board.recent()] == ["idea", "idea"]


def test_failed_search_and_verdicts_feed_the_next_prompt(llm_config: LLMConfig, context: AgentContext,
                                                          store: Store, run_id: str) -> None:
    with ReplayServer(["bad_search.json", "fixed_search.json", "search_replace.json"]) as server:
        agent = LLMCoder(replace(llm_config, base_url=server.base_url, prompt="naive"))
        assert agent.propose(context) == []  # the SEARCH matched nothing: no candidate, an error to report
        (fixed,) = agent.propose(context)
        assert "self.layers = tuple(model.layers)" in fixed.source
        store.add_candidate(run_id, fixed.source, author=agent.name, parent_id=fixed.parent_id)
        verdict = store.record_evaluation(run_id, fixed.candidate_id, tier="fast", status="rejected",
                                          stage="correctness", reason="max_abs_err 0.37 > 1e-4 at decode batch 4",
                                          wall_s=3.2, figures={"max_abs_err": 0.37})
        agent.observe([verdict])
        agent.propose(context)
    second_prompt = server.requests[1]["messages"][1]["content"]
    assert "could not be applied" in second_prompt and "does not match the source" in second_prompt
    assert "as fast as possible" in server.requests[1]["messages"][0]["content"]
    third_prompt = server.requests[2]["messages"][1]["content"]
    assert "max_abs_err 0.37 > 1e-4 at decode batch 4" in third_prompt and '"max_abs_err": 0.37' in third_prompt
    assert "precompute the layer list once" in third_prompt


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATHANOR_NO_SUCH_KEY", raising=False)
    config = AgentsConfig(llm=LLMConfig(api_key_env="ATHANOR_NO_SUCH_KEY"))
    with pytest.raises(ConfigError, match="ATHANOR_NO_SUCH_KEY is not set"):
        make_agents(["llm"], config)


def test_unreachable_endpoint_is_one_clear_line(llm_config: LLMConfig, context: AgentContext) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = LLMCoder(replace(llm_config, base_url=f"http://127.0.0.1:{port}/v1"))
    started = time.monotonic()
    with pytest.raises(AgentError, match=f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1") as info:
        agent.propose(context)
    assert "\n" not in str(info.value) and time.monotonic() - started < 10


def test_wrong_path_is_reported(llm_config: LLMConfig, context: AgentContext) -> None:
    with ReplayServer([]) as server:
        agent = LLMCoder(replace(llm_config, base_url=server.base_url.removesuffix("/v1")))
        with pytest.raises(AgentError, match="answered 404"):
            agent.propose(context)


def test_unknown_prompt_style(llm_config: LLMConfig) -> None:
    with pytest.raises(ConfigError, match="--llm-prompt: no prompt 'clever'"):
        LLMCoder(replace(llm_config, prompt="clever"))
