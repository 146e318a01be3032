"""The agent registry (`--agents`), the board, and the budget bandit shifting evaluation time
towards the agent that improves more per second."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from athanor.agents import (
    AGENT_FACTORIES,
    Agent,
    AgentContext,
    AgentsConfig,
    Board,
    BudgetAllocator,
    BudgetConfig,
    Proposal,
    gain_of,
    make_agents,
    parse_agent_names,
    register_agent,
)
from athanor.errors import ConfigError
from athanor.store import EvaluationRecord, Store


class EchoAgent:
    """A minimal agent: proposes the incumbent with a comment appended."""

    name = "echo"

    def propose(self, context: AgentContext) -> list[Proposal]:
        return [Proposal(context.incumbent_source + "# echo\n", context.incumbent_id, self.name, "echo")]

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        pass


def test_unknown_agent_names_the_flag_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"--agents: unknown agent 'gpt'; known agents: cli, llm"):
        make_agents(parse_agent_names("llm, gpt"), AgentsConfig())
    with pytest.raises(ConfigError, match="--agents: no agent given"):
        make_agents(parse_agent_names(" , "))


def test_register_a_factory(monkeypatch: pytest.MonkeyPatch, context: AgentContext) -> None:
    monkeypatch.setitem(AGENT_FACTORIES, "placeholder", AGENT_FACTORIES["llm"])
    register_agent("echo", lambda config, board: EchoAgent())
    try:
        (agent,) = make_agents(parse_agent_names("echo,echo"), AgentsConfig())
        assert isinstance(agent, Agent)
        assert agent.propose(context)[0].source.endswith("# echo\n")
    finally:
        AGENT_FACTORIES.pop("echo")


def test_board_posts_are_seen_in_order(board: Board, store: Store, run_id: str) -> None:
    board.idea("llm", "fuse gate and up")
    board.result("variant", "fused_qkv 1.07x", candidate_id="ab" * 8)
    warning = board.warning("cli", "x" * 5000)
    assert warning.text.endswith("...(cut)") and len(warning.text) < 2100
    assert [p.agent for p in board.recent()] == ["llm", "variant", "cli"]
    assert [p.agent for p in Board(store, run_id).recent(limit=2)] == ["variant", "cli"]


def _evaluation(author: str, speedup: float, accepted: bool, wall_s: float) -> EvaluationRecord:
    return EvaluationRecord(id=1, run_id="r", candidate_id="c", incumbent_id="i", author=author, tier="fast",
                            status="accepted" if accepted else "rejected", accepted=accepted, stage="timing",
                            reason="", speedup=speedup, speedup_ci_low=speedup, speedup_ci_high=speedup,
                            gpu_s_per_1k=math.nan, wall_s=wall_s, shapes=(), figures={}, created_at=0.0)


def test_gain_is_log_speedup_of_accepted_candidates() -> None:
    assert gain_of(_evaluation("a", 1.1, True, 5)) == pytest.approx(math.log(1.1))
    assert gain_of(_evaluation("a", 1.1, False, 5)) == 0.0
    assert gain_of(_evaluation("a", math.nan, True, 5)) == 0.0


def _simulate(rounds: int, arms: dict[str, tuple[float, float, float]], seed: int) -> dict[str, float]:
    """Seconds of evaluation each agent got; arms: name -> (P(improve), gain when it does, seconds)."""
    bandit = BudgetAllocator(list(arms), BudgetConfig(seed=seed))
    rng = np.random.default_rng(seed + 1)
    spent = dict.fromkeys(arms, 0.0)
    for _ in range(rounds):
        agent = bandit.choose()
        p, gain, seconds = arms[agent]
        bandit.record_evaluation(_evaluation(agent, math.exp(gain), bool(rng.random() < p), seconds))
        spent[agent] += seconds
    return spent


def test_budget_shifts_to_the_agent_with_more_gain_per_second() -> None:
    # "slow" gains more per evaluation (3% at 40%) but each takes 60 s: 0.02%/s. "quick" gains 1% at
    # 30% in 5 s: 0.06%/s. Per evaluation slow looks better; per second quick is 3x better.
    arms = {"slow": (0.4, 0.03, 60.0), "quick": (0.3, 0.01, 5.0), "idle": (0.0, 0.0, 10.0)}
    spent = _simulate(600, arms, seed=7)
    total = sum(spent.values())
    assert spent["quick"] / total > 0.6, spent
    assert spent["idle"] / total < 0.15, spent


def test_budget_without_gains_shares_time_evenly() -> None:
    spent = _simulate(400, {"a": (0.0, 0.0, 10.0), "b": (0.0, 0.0, 10.0)}, seed=3)
    assert 0.35 < spent["a"] / (spent["a"] + spent["b"]) < 0.65


def test_budget_shares_and_restriction() -> None:
    bandit = BudgetAllocator(["a", "b"], BudgetConfig(seed=0))
    for _ in range(20):
        bandit.record("a", 10.0, 0.02)
        bandit.record("b", 10.0, 0.0)
    shares = bandit.shares()
    assert shares["a"] > 0.9 and sum(shares.values()) == pytest.approx(1.0)
    assert bandit.choose(["b"]) == "b"
    stats = {s.agent: s for s in bandit.stats()}
    assert stats["a"].evaluations == 20 and stats["a"].rate > stats["b"].rate
    with pytest.raises(ConfigError):
        BudgetAllocator([])
