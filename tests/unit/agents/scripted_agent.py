"""A scripted stand-in for an external coding agent (`claude -p`, `codex exec`, ...): it edits
candidate.py in its working directory as a real agent would.

    scripted_agent.py MODE [PROMPT]     (without PROMPT, the prompt is read from stdin)

MODE: edit (change the candidate, write DESCRIPTION.txt), noop (change nothing), slow (edit, then
hang past any time limit, with a child process that must be killed too).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

mode = sys.argv[1]
prompt = sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()
assert "README.md" in prompt, prompt
readme = Path("README.md").read_text()
assert "evaluate.sh" in readme and "make `candidate.py` faster" in readme
assert os.access("evaluate.sh", os.X_OK)
Path("seen_prompt.txt").write_text(prompt)
if mode in ("edit", "slow"):
    source = Path("candidate.py").read_text()
    Path("candidate.py").write_text(source.replace("graph_safe = True", "graph_safe = False  # scripted"))
    Path("DESCRIPTION.txt").write_text("turn CUDA graphs off to test the plumbing\n")
    print("edited candidate.py")
if mode == "slow":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path("child.pid").write_text(str(child.pid))
    time.sleep(600)
