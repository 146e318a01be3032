"""Tests here run the Triton kernels in Triton's CPU interpreter (fp32, tiny shapes).

TRITON_INTERPRET is set before any kernel module is imported (the dispatchers import them
lazily), so the folder runs on a machine without a GPU. Without Triton installed, the Triton
cases are skipped and the PyTorch fallbacks are still checked against the reference. The
`gen` fixture (a freshly seeded generator) is in tests/conftest.py.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
