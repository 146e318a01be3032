"""The CLI agent with a scripted command: the workspace it prepares, the candidate it collects,
prompts by argument or stdin, the time limit (killing the command's process group), and bad
commands."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from athanor.agents import AgentContext, AgentsConfig, Board, CLIAgentConfig, make_agents
from athanor.agents.cli_agent import CLIAgent
from athanor.errors import ConfigError
from athanor.store import Store

SCRIPT = Path(__file__).parent / "scripted_agent.py"


def _config(root: Path, command: str, **kw: object) -> CLIAgentConfig:
    root.mkdir(exist_ok=True)
    return CLIAgentConfig(command=command, workspace_root=str(root), time_limit_s=30, **kw)  # type: ignore[arg-type]


@pytest.fixture
def workspaces(tmp_path: Path) -> Path:
    """Workspaces go to their own folder (the store's database lives in the test's tmp_path)."""
    return tmp_path / "workspaces"


def test_collects_the_edited_candidate(workspaces: Path, context: AgentContext, board: Board) -> None:
    agent = make_agents(["cli"], AgentsConfig(cli=_config(workspaces, f"{sys.executable} {SCRIPT} edit {{prompt}}")),
                        board=board)[0]
    (proposal,) = agent.propose(context)
    assert "graph_safe = False  # scripted" in proposal.source
    assert proposal.description == "turn CUDA graphs off to test the plumbing"
    assert proposal.parent_id == context.incumbent_id and proposal.author == "cli"
    assert list(workspaces.iterdir()) == []  # the workspace is cleaned up
    assert board.recent()[-1].candidate_id == proposal.candidate_id


def test_workspace_and_prompt_on_stdin(workspaces: Path, context: AgentContext, store: Store, run_id: str) -> None:
    agent = CLIAgent(_config(workspaces, f"{sys.executable} {SCRIPT} edit", keep_workspaces=True,
                             model="smollm2-135m", evaluate_args=("--device", "cpu")))
    (proposal,) = agent.propose(context)
    (workspace,) = workspaces.iterdir()
    assert "README.md" in (workspace / "seen_prompt.txt").read_text()
    readme = (workspace / "README.md").read_text()
    assert "aten::mm  61.2%" in readme and "cheating is detected" in readme
    script = (workspace / "evaluate.sh").read_text()
    assert "evaluate candidate.py --model smollm2-135m --incumbent incumbent.py --json verdict.json --device cpu" in script
    assert (workspace / "incumbent.py").read_text() == context.incumbent_source

    # The verdict of that candidate reaches the next README.
    store.add_candidate(run_id, proposal.source, author="cli")
    agent.observe([store.record_evaluation(run_id, proposal.candidate_id, tier="fast", status="rejected",
                                           stage="timing", reason="speedup 0.97 below the noise floor")])
    agent.propose(context)
    newest = max(workspaces.iterdir(), key=lambda p: p.stat().st_mtime)
    assert "speedup 0.97 below the noise floor" in (newest / "README.md").read_text()


def test_unchanged_candidate_gives_no_proposal(workspaces: Path, context: AgentContext) -> None:
    agent = CLIAgent(_config(workspaces, f"{sys.executable} {SCRIPT} noop {{prompt}}"))
    assert agent.propose(context) == []


def test_time_limit_kills_the_process_group_and_keeps_the_edit(workspaces: Path, context: AgentContext) -> None:
    agent = CLIAgent(_config(workspaces, f"{sys.executable} {SCRIPT} slow {{prompt}}", keep_workspaces=True))
    agent = CLIAgent(replace(agent.config, time_limit_s=2.0))
    started = time.monotonic()
    (proposal,) = agent.propose(context)
    assert time.monotonic() - started < 20
    assert "time limit" in proposal.description
    (workspace,) = workspaces.iterdir()
    child = int((workspace / "child.pid").read_text())
    time.sleep(0.2)
    assert not _alive(child)  # the agent's own child was killed with it


def _alive(pid: int) -> bool:
    """Running (a killed orphan may linger as a zombie until its new parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "\nState:\tZ" in status.read_text())


def test_bad_commands_are_config_errors(workspaces: Path) -> None:
    with pytest.raises(ConfigError, match="'no-such-coding-agent' is not an executable on PATH"):
        CLIAgent(_config(workspaces, "no-such-coding-agent -p {prompt}"))
    with pytest.raises(ConfigError, match="--cli-command: empty"):
        CLIAgent(_config(workspaces, "  "))
