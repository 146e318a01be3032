"""A small stand-in for a candidate's source: the agents only edit text, so no real forward is needed."""

INCUMBENT = '''"""A toy forward pass."""

import torch


class Forward:
    graph_safe = True

    def __init__(self, model):
        self.model = model

    def decode(self, batch):
        hidden = self.model.embed(batch.tokens)
        for layer in self.model.layers:
            q = layer.q_proj(hidden)
            k = layer.k_proj(hidden)
            v = layer.v_proj(hidden)
            hidden = hidden + layer.attend(q, k, v)
        return self.model.head(hidden)


def build(model, ctx):
    return Forward(model)
'''
