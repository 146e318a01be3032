"""Model core: specs, weights, loaders, tokenizer and the reference forward (the oracle).

Imports nothing else of athanor's but `athanor.errors`.
"""

from athanor.model.model import Model
from athanor.model.seam import BuildContext, DecodeBatch, Forward, Layout, PrefillBatch, make_prefill_batch
from athanor.model.spec import ModelSpec, MoESpec, RopeScaling

__all__ = [
    "BuildContext",
    "DecodeBatch",
    "Forward",
    "Layout",
    "MoESpec",
    "Model",
    "ModelSpec",
    "PrefillBatch",
    "RopeScaling",
    "make_prefill_batch",
]
