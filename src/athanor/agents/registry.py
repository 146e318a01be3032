"""Building agents by name, for `athanor compile --agents variant,llm,cli`.

`AGENT_FACTORIES` maps a name to a factory `(AgentsConfig, Board | None) -> Agent`. The LLM coder
and the CLI agent register here; the variant-search agent registers itself from the compile loop:

    from athanor.agents.registry import register_agent
    register_agent("variant", lambda config, board: VariantSearch(config.variant, board=board))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from athanor.agents.base import Agent
from athanor.agents.board import Board
from athanor.agents.config import AgentsConfig
from athanor.errors import ConfigError

AgentFactory = Callable[[AgentsConfig, Board | None], Agent]


def _llm(config: AgentsConfig, board: Board | None) -> Agent:
    from athanor.agents.llm import LLMCoder  # imports the openai client only when asked for

    return LLMCoder(config.llm, board=board)


def _cli(config: AgentsConfig, board: Board | None) -> Agent:
    from athanor.agents.cli_agent import CLIAgent

    return CLIAgent(config.cli, board=board)


AGENT_FACTORIES: dict[str, AgentFactory] = {"llm": _llm, "cli": _cli}
"""Every known agent kind; add to it with `register_agent`."""


def register_agent(name: str, factory: AgentFactory) -> None:
    """Make `name` available to `make_agents` (replacing any factory of that name)."""
    AGENT_FACTORIES[name] = factory


def parse_agent_names(text: str) -> list[str]:
    """`"variant, llm,cli"` -> `["variant", "llm", "cli"]` (duplicates dropped, order kept)."""
    return list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def make_agents(names: Sequence[str], config: AgentsConfig | None = None, *, board: Board | None = None,
                flag: str = "--agents") -> list[Agent]:
    """The agents named, built from `config`; ConfigError naming `flag` for an unknown or empty list."""
    config = config or AgentsConfig()
    names = list(dict.fromkeys(names))
    if not names:
        raise ConfigError(f"{flag}: no agent given; choose from {', '.join(sorted(AGENT_FACTORIES))}")
    unknown = [n for n in names if n not in AGENT_FACTORIES]
    if unknown:
        raise ConfigError(f"{flag}: unknown agent {', '.join(map(repr, unknown))}; "
                          f"known agents: {', '.join(sorted(AGENT_FACTORIES))}")
    return [AGENT_FACTORIES[name](config, board) for name in names]
