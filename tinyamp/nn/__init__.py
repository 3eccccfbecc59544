"""Neural-network layers built on tinyamp's ops: Module, Parameter and the usual layers.

Example::

    from tinyamp import nn
    model = nn.MLP([784, 1024, 1024, 10])
    model.named_parameters()[0][0]  # "0.weight"
"""

from tinyamp.nn import init
from tinyamp.nn.activation import GELU, ReLU, Tanh
from tinyamp.nn.attention import CausalSelfAttention, causal_mask
from tinyamp.nn.container import ModuleList, Sequential
from tinyamp.nn.dropout import Dropout
from tinyamp.nn.embedding import Embedding
from tinyamp.nn.language_model import NeuralLanguageModel
from tinyamp.nn.linear import Linear
from tinyamp.nn.mlp import MLP
from tinyamp.nn.module import LoadResult, Module, StateDictError
from tinyamp.nn.normalization import LayerNorm
from tinyamp.nn.parameter import Parameter
from tinyamp.nn.transformer import CharTransformer, TransformerBlock

__all__ = [
    "Module", "Parameter", "StateDictError", "LoadResult", "init",
    "Linear", "LayerNorm", "Embedding", "Dropout", "ReLU", "GELU", "Tanh",
    "Sequential", "ModuleList", "MLP",
    "CausalSelfAttention", "causal_mask", "TransformerBlock", "CharTransformer", "NeuralLanguageModel",
]  # fmt: skip
