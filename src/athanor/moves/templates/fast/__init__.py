"""A fast forward pass for the dense Llama/Qwen family and its MoE cousins, one switch per move.

This is a candidate file (docs/architecture.md, "The candidate seam"): `build(model, ctx)` returns a
`Forward`. It computes what `athanor.model.reference` computes, with the choices in `OPTIONS`
below: fused weights, Triton kernels from `athanor.kernels`, a KV-cache layout, torch.compile,
CUDA-graph safety, and (quality mode only) linear layers on lower-precision weight copies.
Each option is documented by its `Move` in `athanor.moves`.

`athanor.moves.render` writes this file from the pieces of the package `athanor.moves.templates.fast`,
one section each, in the order below, and fills in only the OPTIONS block; everything else is ordinary
code an agent may edit. `FastForward` (the last section) composes the others into one step:

- options: the OPTIONS dict and how a kernel call reads its option;
- weights: each layer's weights, fused or copied once in build();
- linear: every linear layer (cuBLAS, Triton split-K, oneDNN on a CPU);
- kv_cache: the pages of keys and values, and where a token's go;
- attention: QKV, q/k norms, RoPE, the cache write and attention, in prefill and decode;
- mlp: the dense SwiGLU MLP (also the MoE models' shared expert);
- moe: the routed experts and the router;
- fused: the decode step on fused GEMVs (norms, SiLU-mul, residual adds and routing inside the projections);
- forward: prefill, decode, `build` and the seam version.
"""

PIECES: tuple[str, ...] = ("options", "weights", "linear", "kv_cache", "attention", "mlp", "moe", "fused", "forward")
"""The modules of this package a rendered candidate concatenates, in this order (each uses only those before it)."""
