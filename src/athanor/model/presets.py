"""Named architecture presets: real models' shapes, for random-weight speed work and tests.

The shapes are those of the published HF `config.json` of each model.
"""

from __future__ import annotations

import math

from athanor.errors import ConfigError
from athanor.model.spec import MLASpec, ModelSpec, MoESpec, RopeScaling

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
            num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
            max_position_embeddings=8192, tie_embeddings=True,
        ),
        ModelSpec(
            name="llama-3.2-1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
            num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
            rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192),
            rms_norm_eps=1e-5, max_position_embeddings=131072, tie_embeddings=True,
        ),
        ModelSpec(
            name="llama-3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
            num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
            rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192),
            rms_norm_eps=1e-5, max_position_embeddings=131072,
        ),
        ModelSpec(
            name="qwen3-30b-a3b", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
            num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
            max_position_embeddings=40960, qk_norm=True, family="qwen3_moe",
            moe=MoESpec(num_experts=128, top_k=8, intermediate_size=768, scoring="softmax", renormalize=True),
        ),
        ModelSpec(
            name="mixtral-8x7b", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_layers=32,
            num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-5,
            max_position_embeddings=32768, family="mixtral",
            moe=MoESpec(num_experts=8, top_k=2, intermediate_size=14336, scoring="softmax", renormalize=True),
        ),
        ModelSpec(  # the text model of google/gemma-3-27b-it: five local (1,024-token window) layers to a global one
            name="gemma-3-27b", vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_layers=62,
            num_heads=32, num_kv_heads=16, head_dim=128, rope_theta=1000000.0,
            rope_scaling=RopeScaling(factor=8.0, kind="linear"), rms_norm_eps=1e-6, max_position_embeddings=131072,
            tie_embeddings=True, qk_norm=True, family="gemma3_text",
            layer_windows=tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(62)), local_rope_theta=10000.0,
            norm_unit_offset=True, sandwich_norms=True, embed_scale=5376 ** 0.5, activation="gelu_tanh",
            attn_scale=168 ** -0.5,
        ),
        ModelSpec(  # openai/gpt-oss-20b, unquantized: 32 experts of which 4 per token, windows of 128 on every other layer
            name="gpt-oss-20b", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_layers=24,
            num_heads=64, num_kv_heads=8, head_dim=64, rope_theta=150000.0,
            rope_scaling=RopeScaling(factor=32.0, original_max_position_embeddings=4096, kind="yarn", beta_fast=32.0,
                                     beta_slow=1.0, attention_factor=0.1 * math.log(32.0) + 1.0, truncate=False),
            rms_norm_eps=1e-5, max_position_embeddings=131072, attn_bias=True, out_bias=True, attn_sinks=True,
            family="gpt_oss", layer_windows=tuple(128 if i % 2 == 0 else 0 for i in range(24)),
            moe=MoESpec(num_experts=32, top_k=4, intermediate_size=2880, scoring="softmax", renormalize=True,
                        logit_bias=True, expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702),
        ),
        ModelSpec(  # deepseek-ai/DeepSeek-V3's shapes cut to its 3 dense layers and 2 of its 58 MoE ones, to fit one GPU
            name="deepseek-v3-5l", vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_layers=5,
            num_heads=128, num_kv_heads=128, head_dim=192, rope_theta=10000.0,
            rope_scaling=RopeScaling(factor=40.0, original_max_position_embeddings=4096, kind="yarn", beta_fast=32.0,
                                     beta_slow=1.0, attention_factor=1.0),
            rms_norm_eps=1e-6, max_position_embeddings=163840, family="deepseek_v3", dense_layers=(0, 1, 2),
            mla=MLASpec(kv_rank=512, q_rank=1536, nope_dim=128, rope_dim=64, v_dim=128),
            attn_scale=192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2,
            moe=MoESpec(num_experts=256, top_k=8, intermediate_size=2048, scoring="sigmoid", renormalize=True,
                        shared_intermediate_size=2048, num_groups=8, top_groups=4, routed_scale=2.5),
        ),
        # Tiny presets for tests: every code path, in milliseconds.
        ModelSpec(
            name="tiny-dense", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4,
            num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=512,
        ),
        ModelSpec(
            name="tiny-qwen", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=3,
            num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=512,
            qk_norm=True, attn_bias=True, tie_embeddings=True, family="qwen3",
        ),
        ModelSpec(
            name="tiny-moe", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=3,
            num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=512,
            qk_norm=True, family="qwen3_moe",
            moe=MoESpec(num_experts=8, top_k=2, intermediate_size=32, scoring="softmax", renormalize=True,
                        shared_intermediate_size=48, shared_gate=True),
        ),
    ]
}


def get_preset(name: str) -> ModelSpec:
    """The preset called `name`, or a ConfigError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"unknown model preset {name!r}: use one of {known}") from None
