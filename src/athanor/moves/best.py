"""The "best known" candidates: renders of the template with the options expected to be fastest.

These are hand-picked starting points for the search, not measured optima: each choice is a kernel or
fusion that removes work or launches at decode batch sizes on a Hopper-class GPU, kept where it made
the whole decode step faster (`athanor bench decode`), not just its own kernel:

- `gemv`: the fused-GEMV layer (norms, SiLU-mul and residual adds inside the projections; batch 1,
  cuBLAS elsewhere). MoE keeps gate and up unfused because fusing copies two thirds of the weights.
- `attention`: the split-KV kernel and a merge kernel. The one-kernel attention (`triton_fused`: RoPE,
  cache write and merge inside) is slower in the whole step, its heavier programs held resident
  through the QKV projection's weight stream.
- `rope`: the QKV GEMV's epilogue rotates each head and writes the cache: one launch fewer a layer.
- `routing` (MoE): the router's logits summed by the O projection as it writes the residual stream
  (`triton_o_epilogue`): no router GEMV launch. The top-k in the router's epilogue adds a serial tail,
  and ranking in every expert program delays each program's first weight load: both are slower.
- `merge_early` (the attention merge lets the O projection launch after its wait) everywhere;
  `early_keys`, `split_early` (the attention's split and merge kernels overlapping their neighbours)
  and `evict_weights="all"` (weights read with L2's evict-first hint) for MoE only: on dense models
  they are neutral or slower.
- `lm_head`: the final RMSNorm and the greedy argmax inside a Triton LM head, which streams the
  vocabulary's weight faster than cuBLAS and drops the norm and argmax launches; without the argmax
  (`triton_fused`) above hidden size 2048, where the greedy variant is slower at every config tried.
- `prefill_attention`: the Triton flash-attention kernel over the packed chunks, reading each slot's cached keys in
  place: a long prompt's later chunks neither copy the prefix nor go through torch's flash attention, faster end to
  end on long prompts (`athanor bench prefill`).
- `embedding`: a gather that lets the first QKV GEMV launch under it; `triton_qkv_prologue` (the
  gather inside that GEMV) is neutral and left to the search.
"""

from __future__ import annotations

from typing import Any

from athanor.model import ModelSpec
from athanor.moves.render import render

BEST_CUDA: dict[str, Any] = {
    "fused_qkv": True,
    "fused_gate_up": True,
    "rmsnorm": "triton",
    "rope": "triton_qkv_epilogue",
    "attention": "triton_split_kv",
    "kv_layout": "head_major",
    "gemv": "triton_fused",
    "silu_mul": "triton",
    "moe": "triton",
    "routing": "triton",
    "compile": None,
    "graphs": True,
    "merge_early": True,
    "lm_head": "triton_greedy",
    "embedding": "triton",
    "prefill_attention": "triton",
}

BEST_CPU: dict[str, Any] = {
    # On CPU Triton does not run (the kernels fall back to torch) and nothing captures graphs. What pays:
    # oneDNN's GEMMs on weights packed once, for decode batches only (with one thread MKL's sgemm is faster at
    # one row and at prefills), and reading less memory: attention over each slot's cache view instead of a
    # gathered copy. Flex attention ('torch_flex') is a little faster on decode but compiles for seconds a
    # process with a C++ compiler it needs: left to the search.
    "attention": "torch_per_seq",
    "gemv": "onednn_decode",
    "moe": "grouped_mm",
    "graphs": False,
}


def best_options(spec: ModelSpec, device: str = "cuda", lossy: bool = False) -> dict[str, Any]:
    """The best-known options for a model on a device type ("cuda" or "cpu"); with `lossy` (quality
    mode), lower-precision linear layers too: bf16 GEMMs are several times faster than fp32 on a CPU
    with avx512_bf16, and read half the bytes anywhere (a no-op for a model already in bf16)."""
    options = dict(BEST_CUDA if device.startswith("cuda") else BEST_CPU)
    if spec.moe is not None:
        options["fused_gate_up"] = False
        if device.startswith("cuda"):  # the router's sums in the O projection; the merge launched as attention starts
            options["routing"] = "triton_o_epilogue"
            options["early_keys"] = options["split_early"] = True
            options["evict_weights"] = "all"  # the weights read evict-first from L2 (see the docstring)
    if spec.hidden_size > 2048:  # the greedy LM head is slower at this width (see the docstring)
        options["lm_head"] = "triton_fused"
    if lossy:
        options["linear_dtype"] = "bfloat16"
    return options


def best_candidate(spec: ModelSpec, device: str = "cuda") -> str:
    """Source of the best-known candidate for `spec` on `device`."""
    return render("fast", best_options(spec, device))
