"""Named architecture presets: real models' shapes, for random-weight speed work and tests.

The shapes are those of the published HF `config.json` of each model.
"""

from __future__ import annotations

from athanor.errors import ConfigError
from athanor.model.spec import ModelSpec, MoESpec, RopeScaling

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
