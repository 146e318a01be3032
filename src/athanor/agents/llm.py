"""The LLM coder: asks any OpenAI-compatible chat endpoint (OpenAI, Together, vLLM, SGLang, Ollama,
athanor's own server) to edit the incumbent, and turns its reply into a `Proposal`.

Each request is self-contained — system prompt (a style file plus the reply format) and one user
message holding the context and the whole incumbent source — so the prompt never grows with the
run. What the model learns across rounds travels in "your previous attempts": the verdicts of its
candidates (error text, figures) and replies that could not be applied (a SEARCH that matched
nothing), newest last.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Sequence

import openai

from athanor.agents.base import AgentContext, AgentError, Proposal
from athanor.agents.board import Board
from athanor.agents.config import LLMConfig
from athanor.agents.editing import EditError, apply_edit, parse_reply
from athanor.agents.prompting import context_sections, fill, load_prompt, render_verdict
from athanor.errors import ConfigError
from athanor.store import EvaluationRecord

log = logging.getLogger(__name__)


class LLMCoder:
    """An `Agent` backed by a chat model that edits the incumbent's source."""

    def __init__(self, config: LLMConfig, *, board: Board | None = None) -> None:
        self.config = config
        self.name = config.name
        self.board = board
        api_key = "unused"  # local servers ignore it, but the client insists on one
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env, "")
            if not api_key:
                raise ConfigError(
                    f"--agents llm: the environment variable {config.api_key_env} is not set; export the "
                    f"endpoint's API key in {config.api_key_env} (or name another variable, or none for a local server)")
        self.system_prompt = load_prompt(config.prompt, flag="--llm-prompt") + "\n\n" + load_prompt("edit_format")
        self.task_template = load_prompt("task")
        self.client = openai.OpenAI(base_url=config.base_url, api_key=api_key, timeout=config.timeout_s,
                                    max_retries=config.max_retries)
        self._feedback: deque[str] = deque(maxlen=config.feedback_items)
        self._proposed: dict[str, str] = {}  # candidate id -> description, awaiting a verdict

    def messages(self, context: AgentContext) -> list[dict[str, str]]:
        """The chat messages for one request (public so tests and the dashboard can show them)."""
        user = fill(self.task_template, **context_sections(context, list(self._feedback)))
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    def propose(self, context: AgentContext) -> list[Proposal]:
        proposals: list[Proposal] = []
        for _ in range(max(1, context.num_proposals)):
            reply = self._complete(self.messages(context))
            try:
                edit = parse_reply(reply)
                source = apply_edit(context.incumbent_source, edit)
            except EditError as e:
                log.info("%s: reply not applied: %s", self.name, e)
                self._feedback.append(f"Your last reply could not be applied to candidate {context.incumbent_id}: "
                                      f"{e}. No candidate was made from it.")
                continue
            proposal = Proposal(source=source, parent_id=context.incumbent_id, author=self.name,
                                description=edit.description or "LLM edit")
            if proposal.candidate_id in self._proposed or any(p.candidate_id == proposal.candidate_id for p in proposals):
                self._feedback.append("Your last reply repeated an earlier candidate; try a different change.")
                continue
            self._proposed[proposal.candidate_id] = proposal.description
            proposals.append(proposal)
            if self.board is not None:
                self.board.idea(self.name, proposal.description, candidate_id=proposal.candidate_id)
        return proposals

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        for verdict in verdicts:
            description = self._proposed.pop(verdict.candidate_id, None)
            if description is None:
                continue  # another agent's candidate: it reaches the prompt through the context
            self._feedback.append(f"Your candidate {verdict.candidate_id} ({description}) was evaluated: "
                                  + render_verdict(verdict, with_figures=True))
            if self.board is not None and verdict.accepted:
                self.board.result(self.name, f"{description}: {verdict.speedup:.3f}x", candidate_id=verdict.candidate_id)

    def _complete(self, messages: list[dict[str, str]]) -> str:
        where = f"{self.config.base_url} (model {self.config.model})"
        started = time.monotonic()
        try:
            response = self.client.chat.completions.create(
                model=self.config.model, messages=messages,  # type: ignore[arg-type]
                temperature=self.config.temperature, max_tokens=self.config.max_tokens)
        except openai.APIConnectionError as e:
            raise AgentError(f"{self.name}: cannot reach the LLM endpoint {self.config.base_url} "
                             f"({type(e).__name__}: {e}); check --llm-base-url and that the server runs") from None
        except openai.AuthenticationError:
            raise AgentError(f"{self.name}: {where} refused the API key in {self.config.api_key_env or '(none)'}; "
                             "check the key") from None
        except openai.NotFoundError:
            raise AgentError(f"{self.name}: {where} answered 404; check the base URL (it usually ends in /v1) "
                             "and the model name") from None
        except openai.APIStatusError as e:
            raise AgentError(f"{self.name}: {where} answered HTTP {e.status_code}: {str(e)[:200]}") from None
        content = response.choices[0].message.content if response.choices else None
        log.info("%s: reply of %d chars in %.1fs", self.name, len(content or ""), time.monotonic() - started)
        return content or ""
