"""Optimizers that update parameters in place: SGD, Adam, AdamW.

Example::

    from tinyamp import nn, optim
    model = nn.MLP([2, 16, 2])
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    ...; loss.backward(); opt.step(); opt.zero_grad()
"""

from tinyamp.optim.adam import Adam, AdamW
from tinyamp.optim.optimizer import Optimizer
from tinyamp.optim.optimizer_checks import OptimizerStateError
from tinyamp.optim.sgd import SGD

__all__ = ["Optimizer", "OptimizerStateError", "SGD", "Adam", "AdamW"]
