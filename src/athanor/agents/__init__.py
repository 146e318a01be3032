"""The search agents and what they share: the `Agent` seam, the LLM coder, the external CLI agent,
the message board and the budget that divides evaluation time among agents.

The LLM coder and CLI agent modules are imported on demand (`athanor.agents.llm`,
`athanor.agents.cli_agent`) so that importing this package does not load the openai client.
"""

from athanor.agents.base import Agent, AgentContext, AgentError, Proposal
from athanor.agents.board import Board
from athanor.agents.budget import ArmStats, BudgetAllocator, BudgetConfig, gain_of
from athanor.agents.config import AgentsConfig, CLIAgentConfig, LLMConfig
from athanor.agents.editing import EditError
from athanor.agents.registry import AGENT_FACTORIES, make_agents, parse_agent_names, register_agent

__all__ = [
    "AGENT_FACTORIES",
    "Agent",
    "AgentContext",
    "AgentError",
    "AgentsConfig",
    "ArmStats",
    "Board",
    "BudgetAllocator",
    "BudgetConfig",
    "CLIAgentConfig",
    "EditError",
    "LLMConfig",
    "Proposal",
    "gain_of",
    "make_agents",
    "parse_agent_names",
    "register_agent",
]
