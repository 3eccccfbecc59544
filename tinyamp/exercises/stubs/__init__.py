"""myamp: your own mixed precision, one module per tutorial (tinyamp exercises).

formats (1.1 to 1.3), backward (2.1 to 2.3), master_weights (4.1, 4.2), loss_scaling (5.1 to 5.3),
op_policy (6.1), checkpointing (7.1), data_parallel (9.1), eight_bits (10.1 to 10.3).  ``tinyamp exercises
check`` grades them.
"""
