"""Experiments: the same model trained in FP32, naive FP16 and mixed precision, side by side.

* ``regimes``: what each regime changes (weights, activations, master weights, loss scaling);
* ``tasks``: the digits MLP and the character-level transformer (data, model, optimizer, scores);
* ``measure``: lost updates and underflowed gradients, measured during training;
* ``runner``: the training loop with its measurements;
* ``results``: the table and results.json;
* ``figures``: loss curves, the loss scale, and the gradient histogram (matplotlib, optional);
* ``output_folder``: an output folder replaced as a unit, and cleaned after a killed run;
* ``run_settings``: the settings of a training run, one set of rules for the command line and checkpoints;
* ``interrupts``: Ctrl-C and SIGTERM stop a run at a step boundary, so that it can be saved;
* ``divergence``: whether a run diverged, and why, in words.

``tinyamp demo`` and ``tinyamp train`` (``tinyamp.cli``) are thin layers over these.
"""
