"""The "best known" candidates: renders of the template with the options expected to be fastest.

These are hand-picked starting points for the search, not measured optima: every choice below is
a kernel or fusion that removes work or launches at decode batch sizes on a Hopper-class GPU.
`gemv` is the fused-GEMV layer (norms, SiLU-mul and residual adds inside the projections; batch 1
on dense models, cuBLAS elsewhere): on the H200 it took batch-1 decode from 1.129 to 1.030 ms
(llama-3.2-1b) and 4.591 to 4.474 ms (llama-3.1-8b). MoE keeps gate and up unfused because fusing
copies two thirds of the model's weights. `attention` stays split kernel + merge kernel: the one-kernel
attention (`triton_fused`: RoPE, cache write and the merge inside) was slower in the whole step on the
H200 (llama-3.2-1b 0.955 vs 0.938 ms, qwen3-30b-a3b 2.835 vs 2.753 ms; alone, 6.4 vs 6.6 us and 8.7 vs
8.6 us a layer); likely because its heavier programs wait resident through the QKV projection's weight
stream (a guess, not measured). `rope` is the QKV GEMV's RoPE epilogue (the last strip of each head rotates it
and writes the cache: one launch fewer a layer) for dense models: on the H200 at batch 1, triggering the next
launch after its weight stream, llama-3.1-8b 4.237 vs 4.261 ms and llama-3.2-1b 0.932 vs 0.934 ms against the
separate RoPE kernel (11981a0); and for MoE: qwen3-30b-a3b 2.740, 2.741, 2.740 vs 2.771, 2.774, 2.777 ms (alternating,
one call; `bench/results/qwen3-rope-epilogue/`). MoE keeps the separate routing kernel: with the router's epilogue
too qwen3-30b-a3b took 2.935 vs 2.857 ms (the router GEMV's serial top-k tail), and with the routing in the expert
GEMVs (`triton_expert_prologue`) 2.884 vs 2.740 ms (every program ranks the 128 logits before its first weight
load, once per wave of programs; `bench/results/expert-routing/`). The router's logits summed by the O projection as
it writes each strip of the residual stream (`triton_o_epilogue`: no router GEMV launch; a routing kernel on the
sums) took qwen3-30b-a3b to 2.610-2.631 ms against 2.713-2.747 (alternating, two calls; `bench/results/qwen3-router-sums/`,
`bench/results/qwen3-o-sums/`); ranking those sums in the expert programs instead (no routing launch at all) measured
3.543 ms, 2.919 with its expert configs tuned in the step, and was not kept.
`merge_early` (the attention merge lets the O projection launch after its wait): llama-3.2-1b 0.900 vs 0.912 ms,
llama-3.1-8b 4.229 vs 4.260 ms (`bench/results/merge-early/`); qwen3-30b-a3b 2.991 vs 2.903 ms once
(`bench/results/attention-merge/`), neutral since (below), and a gain with `split_early`.
`early_keys` (each attention split program loads its first tile of cached keys before its PDL wait) for MoE only:
qwen3-30b-a3b 2.560, 2.562 vs 2.568, 2.570 ms; llama-3.2-1b 0.875, 0.875 vs 0.879, 0.879 but llama-3.1-8b 4.207 vs
4.190 (alternating, one call; `bench/results/early-keys-16c892d/`), so dense models keep it off.
`split_early` (the split kernel lets the merge kernel launch as it starts) for MoE only, where `merge_early` then
pays too: qwen3-30b-a3b 2.522, 2.520 with both against 2.554, 2.555 (2.530 with `split_early` alone; `merge_early`
alone 2.561, 2.560 against 2.558, 2.560); llama-3.2-1b 0.872, 0.873 against 0.876, 0.876 but llama-3.1-8b 4.214
against 4.149 (alternating, one call each; `bench/results/split-early-6ac56a9/`).
`lm_head` (the final norm inside a Triton LM head) and `embedding` (a gather that lets the first QKV GEMV launch under
it): qwen3-30b-a3b 2.408, 2.408 with both against 2.424, 2.421 (2.409, 2.410 with the LM head alone, 2.420, 2.421 with
the gather alone; alternating, one call, `bench/results/lm-head-ab31ad2/`): the Triton GEMV streams the 622 MB
vocabulary weight at ~4.5 TB/s where cuBLAS read it at ~4.2 (138 against 147 us on the step's critical path) and the
norm kernel and cuBLAS's memset go; llama-3.2-1b 0.869, 0.870 against 0.880, 0.881 and llama-3.1-8b 4.167 against 4.188
(alternating, one call, `bench/results/step-copies-ccf91f1/`).
`lm_head=triton_greedy` (the greedy argmax folded into the LM head: each program's strip into the row's running
maxima with one atomic, a one-program kernel reads the tokens; the engine's argmax kernel goes): qwen3-30b-a3b 2.397,
2.398, 2.398 against 2.402, 2.401; llama-3.2-1b 0.861, 0.862 against 0.865, 0.863 (alternating, one call,
`bench/results/greedy-lm-head-10971d3/`). Not for llama-3.1-8b (hidden size 4096): 4.175 against 4.115, and 4.168 at
the best of its 24 configs tuned in the step (`bench/results/greedy-tune-ce08ef4/`), for reasons not established
(the same registers, no spills). `embedding=triton_qkv_prologue` (the row gathered by the first QKV kernel) measured
neutral with or without it (qwen3-30b-a3b 2.398 with both, 2.400-2.402 alone) and is left to the search.
`evict_weights` (the weight loads with L2's evict-first hint) for MoE: qwen3-30b-a3b 2.379, 2.378, 2.379 with every
weight's ('all') and 2.383 x3 with the experts' only, against 2.397-2.399 (alternating, one call, on a machine at its
full 1980 MHz throughout; 2.387, 2.383 against 2.398 in another call); the experts' gate/up took 724 against 747 us
a step on the critical path. Not for dense models: llama-3.1-8b 4.222 against 4.118 ('all': its fused GEMVs +100 us),
llama-3.2-1b 0.851, 0.851 against 0.847, 0.863 (`bench/results/evict-62d5587/`). Why the hint pays is not
established: every weight is read once a step either way; a guess is that what else the step reads (the KV cache,
activations, partials, the gate/up output the down projection reads) stays in L2.
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
}

BEST_CPU: dict[str, Any] = {
    # On CPU Triton does not run (the kernels fall back to torch) and nothing captures graphs. What pays:
    # oneDNN's GEMMs on weights packed once (2-core CPU, smollm2 fast tier against per_seq alone: decode x1.50,
    # prefill x1.09), and reading less memory: attention over each slot's cache view instead of a gathered
    # copy. Flex attention ('torch_flex') measured x1.05 more on decode, but compiles for ~8 s a process
    # with a C++ compiler it needs: left to the search. oneDNN for decode batches only ('onednn_decode'): on the
    # 2-core AVX2 VM, with the one thread an engine worker runs there, MKL's sgemm is faster at one row and at
    # prefills (whole smollm2, alternating, two runs: 384-token prefill x1.13 and x1.05, batch-1 decode x1.17 and
    # x1.22, batch 16 the same code: x1.05 and x0.97; bench/cpu_gemv_rows.py).
    "attention": "torch_per_seq",
    "gemv": "onednn_decode",
    "moe": "grouped_mm",
    "graphs": False,
}


def best_options(spec: ModelSpec, device: str = "cuda", lossy: bool = False) -> dict[str, Any]:
    """The best-known options for a model on a device type ("cuda" or "cpu"); with `lossy` (quality
    mode), lower-precision linear layers too: bf16 GEMMs are 2-3.5x faster than fp32 on a CPU with
    avx512_bf16, and read half the bytes anywhere (a no-op for a model already in bf16)."""
    options = dict(BEST_CUDA if device.startswith("cuda") else BEST_CPU)
    if spec.moe is not None:
        options["fused_gate_up"] = False
        if device.startswith("cuda"):  # the router's sums in the O projection; the merge launched as attention starts
            options["routing"] = "triton_o_epilogue"
            options["early_keys"] = options["split_early"] = True
            options["evict_weights"] = "all"  # the weights read evict-first from L2 (see the docstring)
    if spec.hidden_size > 2048:  # llama-3.1-8b's greedy LM head is slower at every config (see the docstring)
        options["lm_head"] = "triton_fused"
    if lossy:
        options["linear_dtype"] = "bfloat16"
    return options


def best_candidate(spec: ModelSpec, device: str = "cuda") -> str:
    """Source of the best-known candidate for `spec` on `device`."""
    return render("fast", best_options(spec, device))
