"""The moves: every switch of the template candidate the variant search (or an agent) can flip.

A `Move` names one key of a template's `OPTIONS` dict, the values it may take, the value that
computes what the reference computes the way the reference does (`baseline`), and what it does
and when it helps. `athanor.moves.render` substitutes a choice of values into the template.
A lossy move changes the numbers beyond the model dtype's tolerance: it is searched only in
quality mode (`athanor compile --quality-budget`), where the evaluator admits candidates by KL
divergence and perplexity instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Move:
    """One option of a template candidate."""

    name: str
    """The OPTIONS key."""
    values: tuple[Any, ...]
    """Allowed values (JSON-like literals: bool, str, int, None)."""
    baseline: Any
    """The value that does what the reference forward does."""
    doc: str
    """What the move does, and when it helps."""
    applies_to: Literal["all", "dense", "moe"] = "all"
    """Which models the option changes anything for (others ignore it)."""
    lossy: bool = False
    """Its non-baseline values change the logits beyond the model dtype's tolerance: searched only in
    quality mode (see the module docstring)."""
    cuda_only: tuple[Any, ...] = ()
    """Values with no CPU implementation at all (the Triton ones fall back to torch there instead)."""
    cpu_only: tuple[Any, ...] = ()
    """Values not worth searching on a GPU (host-synced CPU paths the engine cannot capture in graphs)."""

    def __post_init__(self) -> None:
        assert self.baseline in self.values, f"move {self.name}: baseline {self.baseline!r} not in values"


MOVES: tuple[Move, ...] = (
    Move("fused_qkv", (False, True), False,
         "Concatenate wq, wk, wv (and biases) into one weight in build(): one GEMM instead of three. "
         "Helps at small batch, where each projection is a separate weight stream and launch; costs a copy "
         "of the attention weights."),
    Move("fused_gate_up", (False, True), False,
         "Concatenate w_gate and w_up (dense MLP, shared expert, and each routed expert) into one weight: one "
         "GEMM and a strided SiLU-and-multiply. Same trade as fused_qkv; for large MoE the expert copy is "
         "two thirds of the model's size again, so it is memory-bound in the other sense."),
    Move("rmsnorm", ("torch", "triton"), "torch",
         "Triton RMSNorm fused with the residual add before it: one pass over [N, H] instead of four or five "
         "elementwise kernels. Helps at every batch size during decode; bigger share at small models."),
    Move("rope", ("torch", "triton", "triton_fused_cache", "triton_qkv_epilogue"), "torch",
         "Rotary embedding in one Triton kernel for q and k; 'triton_fused_cache' also writes k and v into the "
         "KV cache in the same kernel (decode only), replacing rope's ~10 elementwise ops and two index_put's. "
         "'triton_qkv_epilogue' (the fused-GEMV layer with fused_qkv, batch 1): the QKV projection's last strip "
         "of each head rotates it (q/k-normed first) and writes k and v into the cache, so RoPE costs no launch; "
         "elsewhere it acts as 'triton_fused_cache'."),
    Move("attention", ("torch", "triton_split_kv", "torch_per_seq", "triton_fused", "torch_flex"), "torch",
         "Decode attention as Triton split-KV flash-decoding with GQA: reads each slot's keys once, only up to "
         "its own length, with enough splits to fill the GPU at batch 1. Essential under CUDA graphs, where the "
         "torch path must attend over the whole max_seq_len cache with a mask. 'torch_per_seq' loops over the "
         "batch attending over views of each sequence's pages where they run consecutively, a gather elsewhere (not "
         "graph-safe): the CPU's choice. "
         "'triton_fused' (decode): the split-KV kernel also does RoPE, Qwen3's q/k norms and the KV-cache write "
         "(the rope option then serves prefill only), and the last split of each KV head to finish merges the "
         "splits: one kernel between the QKV and O projections instead of three. On an H200 at batch 1 it is no "
         "faster alone and slower in the whole step, so not the best-known choice there. "
         "'torch_flex' (CPU): the same views as 'torch_per_seq' through flex attention compiled by Inductor, one "
         "fused pass over each row's keys and values, faster than 'torch_per_seq' at decode batches on a small "
         "CPU; compiles once per process (seconds).",
         cpu_only=("torch_flex",)),
    Move("sdpa", (None, "math", "flash_attention", "efficient_attention", "cudnn_attention"), None,
         "Prefill attention's scaled_dot_product_attention backend: None takes the reference's (flash, then "
         "efficient attention, then math); 'cudnn_attention' is torch 2.11's own "
         "choice on an H200, which builds a host-side plan for every sequence length it has not run, costing "
         "more than the layers' kernels for each new length; "
         "'math' is the unfused reference kernel (it materialises the scores, so it loses on long prompts but "
         "can win on many short ones); 'flash_attention', 'efficient_attention' and 'cudnn_attention' (CUDA "
         "only) are preferred where they apply, with math as the fallback (e.g. for masks a backend does not "
         "take). Prefill is half of a chat workload's cost.",
         cuda_only=("flash_attention", "efficient_attention", "cudnn_attention")),
    Move("prefill_attention", ("torch", "triton"), "torch",
         "Prefill attention over the KV cache: 'torch' is the reference's (one scaled_dot_product_attention for the "
         "batch: a lone chunk with lower-right causal alignment, several padded to the longest with a mask of which "
         "keys each position sees, on the backend the sdpa move picks); 'triton' a flash-attention kernel over the "
         "packed chunks that reads each slot's keys in place, for any chunk position: no padding, no mask, no copy "
         "of a long prompt's cached prefix per chunk. Long prompts and chunked prefills are where it pays."),
    Move("kv_layout", ("head_major", "token_major"), "head_major",
         "KV cache storage: [slots, heads, seq, D] (the reference's; each head's keys contiguous, best for "
         "split-KV reads) or [slots, seq, heads, D] (a token's heads contiguous: cheaper cache writes, "
         "strided reads)."),
    Move("gemv", ("cublas", "triton_splitk", "triton_fused", "onednn", "onednn_decode"), "cublas",
         "Linear layers with <= 16 rows through a Triton split-K skinny GEMM instead of cuBLAS. Helps where "
         "cuBLAS' GEMV leaves SMs idle (narrow outputs, batch 1-8); measure per device and shape. "
         "'triton_fused' (dense decode, <= 8 rows): a Triton GEMV that also does the work around each "
         "projection: the RMSNorms in the QKV and gate/up projections' prologue, SiLU-mul in the down "
         "projection's, the residual adds in the O and down projections' epilogue: 7 kernels per layer "
         "instead of ~12. Helps at batch 1-4, where each small kernel costs more in launch and tail than "
         "its bytes; the weight read must still match cuBLAS. 'onednn' (CPU, any batch): every linear layer "
         "through oneDNN on weights reordered once in build() (a copy of them), faster than MKL's sgemm (what "
         "'cublas' runs there) at decode batches and on large LM heads. 'onednn_decode' (CPU): oneDNN for 2-32 "
         "rows only (decode batches), MKL for one row and for prefills, where oneDNN is slower on a small AVX2 "
         "CPU at one thread.",
         cpu_only=("onednn", "onednn_decode")),
    Move("silu_mul", ("torch", "triton"), "torch",
         "SiLU(gate) * up in one Triton kernel reading the halves of a fused gate|up output in place "
         "(torch needs two kernels and, for a fused output, strided copies)."),
    Move("moe", ("loop", "grouped_mm", "triton"), "loop", applies_to="moe",
         doc="How routed experts run: 'loop' (the reference: per-expert Python loop, host syncs, not "
             "graph-safe), 'grouped_mm' (pairs sorted by expert, torch._grouped_mm; graph-safe), 'triton' "
             "(block-aligned grouping + a Triton expert GEMM reading each used expert once per 16 pairs; "
             "graph-safe). Anything but 'loop' lets the engine capture MoE decode in CUDA graphs."),
    Move("routing", ("torch", "triton", "triton_router_epilogue", "triton_expert_prologue", "triton_o_epilogue",
                     "triton_moe_block"),
         "torch", applies_to="moe",
         doc="Router softmax/sigmoid + top-k + renormalisation in one Triton kernel (torch: ~6 kernels). "
             "'triton_router_epilogue' (the fused-GEMV layer, batch 1): the router GEMV's last program picks the "
             "top-k, so routing costs no launch; 'triton_expert_prologue' (the same layer): every program of the "
             "expert GEMVs ranks the router's logits itself and takes its own pick, so routing costs no launch and "
             "no serial tail; 'triton_o_epilogue' (the same layer): the O projection sums the router's logits as "
             "it writes each strip of the residual stream (fixed point, order-free), so the router's GEMV costs no "
             "launch; 'triton_moe_block' (the same layer): that, and routing and the experts' gate/up and down GEMVs, "
             "in one persistent launch with grid-wide waits where the four kernel boundaries were (slower than "
             "'triton_o_epilogue' on an H200); elsewhere all act as 'triton'."),
    Move("compile", (None, "default", "max-autotune-no-cudagraphs"), None,
         "torch.compile the decode step (dynamic=False; never 'reduce-overhead': the engine captures graphs). "
         "Fuses the remaining torch elementwise work; costs compile time per batch bucket (tens of seconds "
         "for an 8B model), which the objective counts."),
    Move("graphs", (True, False), True,
         "Declare decode graph-safe so the engine captures it in CUDA graphs per batch bucket (removes launch "
         "overhead, dominant at batch 1). Turn off only to debug; ignored when moe='loop'."),
    Move("merge_early", (False, True), False, cuda_only=(True,),
         doc="With attention='triton_split_kv' under programmatic dependent launch: the merge kernel lets the O "
             "projection launch right after its wait, so the O GEMV's programs load their first weight tiles while "
             "the merge runs (else they launch as it exits). A large O projection's early loads can slow the merge "
             "instead. Changes no value."),
    Move("early_keys", (False, True), False, cuda_only=(True,),
         doc="With attention='triton_split_kv' under programmatic dependent launch: each split program loads its "
             "first tile of cached keys and values (written by earlier steps) before waiting for the kernel that "
             "wrote q and the new token's key, and reads that one key again after the wait, so the cache's bytes "
             "stream while the QKV projection finishes. A small gain on an H200 at batch 1 for MoE and small dense "
             "models, a loss on llama-3.1-8b. Changes no value."),
    Move("split_early", (False, True), False, cuda_only=(True,),
         doc="With attention='triton_split_kv' under programmatic dependent launch: the split kernel lets the merge "
             "kernel launch as it starts, so the merge's programs wait resident for it instead of launching once "
             "its last program exits. A small gain on an H200 at batch 1 for MoE (more with merge_early) and small "
             "dense models, a loss on llama-3.1-8b. Changes no value."),
    Move("lm_head", ("linear", "triton_fused", "triton_greedy"), "linear",
         doc="With gemv='triton_fused', at the rows it takes: the final RMSNorm inside the LM head's GEMV (the fused "
             "GEMV with its norm prologue) instead of a norm kernel and then cuBLAS (MKL on a CPU): one launch fewer, "
             "and under programmatic dependent launch the LM head's programs load their first weight tiles while "
             "the last layer ends; on an H200 the Triton GEMV also streams the vocabulary's weight faster than cuBLAS. "
             "'triton_greedy': that, and in a step whose rows are all greedy the "
             "argmax too (the forward's `decode_greedy`): each LM head program folds its strip's argmax into the "
             "row's running maxima with one atomic, a one-program kernel reads the tokens out, and the engine's "
             "argmax kernel goes: a small gain on an H200 at batch 1, except at hidden size 4096 (llama-3.1-8b), "
             "where it is slower. The logits are the fused LM head's, bit for bit where both launch one config."),
    Move("embedding", ("torch", "triton", "triton_qkv_prologue"), "torch",
         doc="The decode step's token embedding as a Triton gather that, under programmatic dependent launch, lets "
             "the next kernel launch as it starts: the first layer's QKV GEMV loads its first weight tiles while "
             "the rows are gathered (after F.embedding's kernel it launches only as that ends). "
             "'triton_qkv_prologue': at one row on the fused layer with "
             "rope='triton_qkv_epilogue', the first layer's QKV kernel reads its row from the embedding itself "
             "(and writes it out for the O projection's residual add): no gather launch; neutral on an H200. "
             "Changes no value."),
    Move("evict_weights", (None, "experts", "all"), None, cuda_only=("experts", "all"),
         doc="The fused-GEMV layer (batch 1) reads weights with L2's evict-first policy (`ld...L2::cache_hint`; a "
             "hint: no value changes): 'experts' the routed experts' GEMVs only (MoE), 'all' every projection's and "
             "the LM head's too. Every weight is read once a step and no layer's fits L2 beside the next's, so "
             "keeping them is worth nothing. On an H200 at batch 1 'all' helps MoE models most and slows "
             "llama-3.1-8b's fused GEMVs."),
    Move("linear_dtype", (None, "bfloat16"), None, lossy=True,
         doc="Linear layers (every projection, the dense and shared-expert MLPs, the LM head) run on bf16 copies "
             "of their weights made in build(): activations are cast to bf16 and each result back to the model "
             "dtype. On a CPU with avx512_bf16 the bf16 GEMMs are several times faster than fp32 at decode shapes; "
             "on a GPU with an fp32 model it halves the weight bytes read. Routed experts and the router stay in the model dtype (a bf16 router flips top-k choices "
             "near ties for a negligible [E, H] GEMM). Does nothing when the model dtype is already bf16. "
             "Lossy: quality mode only."),
)

MOVES_BY_NAME: dict[str, Move] = {m.name: m for m in MOVES}


def baseline_options() -> dict[str, Any]:
    """Every option at its baseline value (the reference's computation in the template's code)."""
    return {m.name: m.baseline for m in MOVES}


def search_space(moe: bool, lossy: bool = False) -> dict[str, tuple[Any, ...]]:
    """The options that change anything for a dense (moe=False) or MoE model, with their values;
    lossy moves only with `lossy` (quality mode)."""
    wanted = ("all", "moe") if moe else ("all", "dense")
    return {m.name: m.values for m in MOVES if m.applies_to in wanted and (lossy or not m.lossy)}
