"""Building blocks of a fast forward pass: Triton kernels, each with a PyTorch fallback.

Every public function here is a *dispatcher*: it runs the Triton kernel (from `jit/`) when
Triton is importable and the tensors are on CUDA (or `TRITON_INTERPRET=1` is set, which is how
the CPU tests run the kernels), and the PyTorch fallback otherwise. `impl="torch"` or
`impl="triton"` forces one. How a Triton kernel launches (tiles, warps, when it lets the next
kernel start) is a keyword parameter of its dispatcher with the fastest known value as its default,
never an environment variable, so a candidate that changes one says so in its source. The
fallbacks are the numerical reference each kernel is tested against; they follow
`athanor.model.reference` wherever the reference has the same operation.

Candidates import these (`from athanor.kernels import rms_norm, decode_attention, ...`); the
package imports without Triton.
"""

from athanor.kernels.activation import silu_mul
from athanor.kernels.attention import decode_attention, num_kv_splits, rope_cache_attention
from athanor.kernels.dispatch import HAS_TRITON, use_triton
from athanor.kernels.embedding import embedding
from athanor.kernels.flex_decode import decode_attention_flex
from athanor.kernels.gemv import (
    fused_linear,
    fused_linear_argmax,
    linear,
    linear_route,
    qkv_rope_cache,
    router_topk,
    splitk_linear,
)
from athanor.kernels.moe import (
    ExpertGroups,
    RouterLogits,
    expert_gemv,
    group_by_expert,
    grouped_mm,
    has_grouped_mm,
    moe_experts,
    route,
    routed_experts,
)
from athanor.kernels.moe_block import MoeBlockConfig, MoeBlockOutput, moe_block
from athanor.kernels.norm import add_rms_norm, rms_norm
from athanor.kernels.per_seq_attention import decode_attention_per_seq
from athanor.kernels.prefill_attention import prefill_attention
from athanor.kernels.rope import KVWrite, rope, rope_and_cache
from athanor.kernels.sampling import greedy, sample_top_k_top_p

__all__ = [
    "HAS_TRITON",
    "ExpertGroups",
    "KVWrite",
    "MoeBlockConfig",
    "MoeBlockOutput",
    "RouterLogits",
    "add_rms_norm",
    "decode_attention",
    "decode_attention_flex",
    "decode_attention_per_seq",
    "embedding",
    "expert_gemv",
    "fused_linear",
    "fused_linear_argmax",
    "greedy",
    "group_by_expert",
    "grouped_mm",
    "has_grouped_mm",
    "linear",
    "linear_route",
    "moe_block",
    "moe_experts",
    "num_kv_splits",
    "prefill_attention",
    "qkv_rope_cache",
    "rms_norm",
    "rope",
    "rope_and_cache",
    "rope_cache_attention",
    "route",
    "routed_experts",
    "router_topk",
    "sample_top_k_top_p",
    "silu_mul",
    "splitk_linear",
    "use_triton",
]
