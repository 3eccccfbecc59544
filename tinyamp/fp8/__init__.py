"""Eight bits: FP8 formats by hand and the per-tensor scales that make them usable."""
