"""The CPU tier runs Triton's kernels in its interpreter: TRITON_INTERPRET is set here, before any test module
imports Triton (torch's attention modules do, and Triton makes its own @triton.jit helpers such as `tl.cdiv`
interpretable only if the variable is set by then). So the kernel tests run on a machine without a GPU, in fp32 and
tiny shapes; without Triton installed it changes nothing, and the Triton cases skip."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
