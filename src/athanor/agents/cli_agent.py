"""The CLI agent: runs an external coding agent (`claude -p`, `codex exec`, `aider --message`, ...)
in a scratch workspace and collects the candidate it leaves behind.

The workspace holds `candidate.py` (the incumbent), `README.md` (the task with the run's context)
and `evaluate.sh` (runs `athanor evaluate candidate.py` against the incumbent, so the agent can
check itself). The command is a template split like a shell line but run without a shell:
`{prompt}` in it becomes one argument holding the task; without `{prompt}` the task goes to the
command's stdin. `{workspace}` and `{candidate}` are the workspace and the candidate file. The
command runs in its own process group with the workspace as its working directory and is killed,
group and all, at the time limit; whatever valid candidate is there then is still collected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from athanor.agents.base import AgentContext, AgentError, Proposal
from athanor.agents.board import Board
from athanor.agents.config import CLIAgentConfig
from athanor.agents.prompting import context_sections, fill, load_prompt, render_verdict
from athanor.errors import ConfigError
from athanor.store import EvaluationRecord

log = logging.getLogger(__name__)

PROMPT = ("Read README.md in the current directory and follow it: make candidate.py faster while keeping its "
          "outputs, check it with ./evaluate.sh, and describe your change in DESCRIPTION.txt.")
"""What the command is asked; the details live in the workspace's README.md."""


class CLIAgent:
    """An `Agent` that delegates one edit per `propose` call to an external coding agent."""

    def __init__(self, config: CLIAgentConfig, *, board: Board | None = None) -> None:
        self.config = config
        self.name = config.name
        self.board = board
        try:
            self.argv_template = shlex.split(config.command)
        except ValueError as e:
            raise ConfigError(f"--cli-command: cannot split {config.command!r}: {e}") from None
        if not self.argv_template:
            raise ConfigError("--cli-command: empty; give the coding agent's command, e.g. 'claude -p {prompt}'")
        if shutil.which(self.argv_template[0]) is None:
            raise ConfigError(f"--cli-command: {self.argv_template[0]!r} is not an executable on PATH; install it "
                              "or give its full path")
        self.guidance = load_prompt(config.guidance, flag="--cli-guidance") if config.guidance else ""
        self.readme_template = load_prompt("cli_readme")
        self._feedback: deque[str] = deque(maxlen=4)
        self._proposed: dict[str, str] = {}

    def propose(self, context: AgentContext) -> list[Proposal]:
        root = self.config.workspace_root or None
        workspace = Path(tempfile.mkdtemp(prefix=f"athanor-{self.name}-", dir=root))
        try:
            return self._attempt(context, workspace)
        finally:
            if self.config.keep_workspaces:
                log.info("%s: workspace kept at %s", self.name, workspace)
            else:
                shutil.rmtree(workspace, ignore_errors=True)

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        for verdict in verdicts:
            description = self._proposed.pop(verdict.candidate_id, None)
            if description is not None:
                self._feedback.append(f"Your candidate {verdict.candidate_id} ({description}): "
                                      + render_verdict(verdict, with_figures=True))

    def write_workspace(self, context: AgentContext, workspace: Path) -> None:
        """Lay out candidate.py, incumbent.py, README.md and evaluate.sh in `workspace`."""
        (workspace / "candidate.py").write_text(context.incumbent_source)
        (workspace / "incumbent.py").write_text(context.incumbent_source)
        sections = context_sections(context, list(self._feedback))
        readme = fill(self.readme_template, **sections, guidance=self.guidance,
                      time_limit_s=f"{self.config.time_limit_s:.0f}")
        (workspace / "README.md").write_text(readme)
        athanor = Path(sys.executable).parent / "athanor"
        launcher = [str(athanor)] if athanor.exists() else [sys.executable, "-m", "athanor"]
        argv = [*launcher, "evaluate", "candidate.py", "--model", self.config.model, "--incumbent", "incumbent.py",
                "--json", "verdict.json", *self.config.evaluate_args]
        script = workspace / "evaluate.sh"
        script.write_text("#!/bin/sh\n# Evaluate candidate.py against incumbent.py; the verdict lands in verdict.json.\n"
                          f'cd "$(dirname "$0")" && exec {shlex.join(argv)} "$@"\n')
        script.chmod(0o755)

    def _attempt(self, context: AgentContext, workspace: Path) -> list[Proposal]:
        self.write_workspace(context, workspace)
        candidate = workspace / "candidate.py"
        values = {"prompt": PROMPT, "workspace": str(workspace), "candidate": str(candidate)}
        argv = [_substitute(arg, values) for arg in self.argv_template]
        stdin = None if any("{prompt}" in arg for arg in self.argv_template) else PROMPT
        started = time.monotonic()
        timed_out, output = self._run(argv, workspace, stdin)
        seconds = time.monotonic() - started
        source = candidate.read_text() if candidate.is_file() else ""
        if source.strip() == context.incumbent_source.strip():
            why = "timed out" if timed_out else "finished"
            self._feedback.append(f"Your last attempt {why} after {seconds:.0f}s without changing candidate.py.")
            log.info("%s: %s without changing candidate.py; output tail: %s", self.name, why, output[-500:])
            return []
        try:
            compile(source, "candidate.py", "exec")
        except SyntaxError as e:
            self._feedback.append(f"Your last candidate.py did not parse (line {e.lineno}: {e.msg}); it was dropped.")
            return []
        description = _description(workspace, output) + (" (cut off at the time limit)" if timed_out else "")
        proposal = Proposal(source=source, parent_id=context.incumbent_id, author=self.name, description=description)
        self._proposed[proposal.candidate_id] = description
        if self.board is not None:
            self.board.idea(self.name, description, candidate_id=proposal.candidate_id)
        log.info("%s: collected candidate %s after %.0fs", self.name, proposal.candidate_id, seconds)
        return [proposal]

    def _run(self, argv: list[str], workspace: Path, stdin: str | None) -> tuple[bool, str]:
        """Run the command; (timed out?, the tail of its output)."""
        env = {**os.environ, **self.config.env, "ATHANOR_WORKSPACE": str(workspace)}
        try:
            proc = subprocess.Popen(argv, cwd=workspace, env=env, text=True, start_new_session=True,
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as e:
            raise AgentError(f"{self.name}: cannot run {argv[0]!r}: {e.strerror}") from None
        try:
            output, _ = proc.communicate(stdin, timeout=self.config.time_limit_s)
            if proc.returncode != 0:
                log.info("%s: command exited with %d", self.name, proc.returncode)
            return False, output[-4000:]
        except subprocess.TimeoutExpired:
            log.info("%s: time limit of %.0fs reached; killing the command", self.name, self.config.time_limit_s)
            with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started: the agent and its children
            output, _ = proc.communicate()
            return True, (output or "")[-4000:]


def _substitute(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def _description(workspace: Path, output: str) -> str:
    path = workspace / "DESCRIPTION.txt"
    if path.is_file():
        text = path.read_text().strip()
        if text:
            return text.splitlines()[0][:200]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "edit by an external coding agent"
