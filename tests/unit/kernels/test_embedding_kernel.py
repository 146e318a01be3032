"""The decode step's embedding gather (`athanor.kernels.embedding`) against F.embedding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from athanor.kernels import HAS_TRITON, embedding


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="Triton is "
                                                                                   "not installed")), "torch"])
@pytest.mark.parametrize("hidden", [64, 576, 3000])  # one block, a partial block, blocks over 2048
def test_embedding_is_f_embedding_bit_for_bit(gen, impl, hidden):
    table = torch.randn(50, hidden, generator=gen)
    tokens = torch.tensor([3, 49, 0, 3, 17])  # a repeated token, the first and last rows
    assert torch.equal(embedding(tokens, table, impl=impl), F.embedding(tokens, table))
    assert embedding(tokens[:0], table, impl=impl).shape == (0, hidden)
    wide = torch.randn(50, 2 * hidden, generator=gen)[:, :hidden]  # a table with a row stride wider than its rows
    assert torch.equal(embedding(tokens, wide, impl=impl), F.embedding(tokens, wide))
