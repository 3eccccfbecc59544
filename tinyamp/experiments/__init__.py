"""Experiments: the same model trained in FP32, naive FP16 and mixed precision, side by side.

* ``regimes``: what each regime changes (weights, activations, master weights, loss scaling);
* ``tasks``: the digits MLP and the character-level transformer (data, model, optimizer, scores);
* ``measure``: lost updates and underflowed gradients, measured during training;
* ``runner``: the training loop with its measurements;
* ``results``: the table, results.json, and writing an output folder atomically;
* ``figures``: loss curves, the loss scale, and the gradient histogram (matplotlib, optional).

``tinyamp demo`` and ``tinyamp train`` (``tinyamp.cli``) are thin layers over these.
"""
