"""Configuration of the agents: one frozen dataclass per agent kind, gathered in `AgentsConfig`.

Kept apart from the agents themselves so the CLI can build a configuration without importing the
`openai` client or starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LLMConfig:
    """How to reach the model and how to prompt it."""

    base_url: str = "https://api.openai.com/v1"
    """The endpoint's OpenAI-compatible base URL (e.g. http://localhost:8000/v1 for vLLM)."""
    model: str = "gpt-4.1"
    """The model name the endpoint serves."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key; "" for endpoints that need none (local servers)."""
    prompt: str = "expert"
    """Prompt style: "naive", "expert", or a path to a system-prompt file."""
    temperature: float = 0.7
    max_tokens: int = 16384
    """Room for a whole rewritten file."""
    timeout_s: float = 600.0
    """Per request; long for slow local models writing whole files."""
    max_retries: int = 2
    """The openai client's retries on connection errors and 429/5xx before the agent gives up."""
    feedback_items: int = 4
    """How many of its previous attempts the model is reminded of."""
    name: str = "llm"
    """The agent's name (author of its candidates); set it when running several LLM coders."""


@dataclass(frozen=True)
class CLIAgentConfig:
    """Which command to run and how."""

    command: str = "claude -p {prompt}"
    """The command template (see the module docstring), e.g. `codex exec {prompt}`, `aider --yes
    --message {prompt} candidate.py`."""
    time_limit_s: float = 900.0
    """Wall-clock limit per attempt; the command's process group is killed then."""
    model: str = "smollm2-135m"
    """Passed to `athanor evaluate --model` by evaluate.sh."""
    evaluate_args: tuple[str, ...] = ()
    """Further `athanor evaluate` arguments (e.g. --device cuda --traffic FILE)."""
    guidance: str = "expert"
    """Advice appended to the README: a prompt style ("naive", "expert"), a file path, or "" for none."""
    workspace_root: str = ""
    """Where workspaces are made ("" for the system's temporary directory)."""
    keep_workspaces: bool = False
    """Keep each workspace after collecting (for debugging an agent)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the command (e.g. an API key variable's name it expects)."""
    name: str = "cli"


@dataclass(frozen=True)
class AgentsConfig:
    """What `make_agents` needs to build any registered agent."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    cli: CLIAgentConfig = field(default_factory=CLIAgentConfig)
    variant: Any = None
    """The variant-search agent's own configuration (defined and read by its factory)."""
