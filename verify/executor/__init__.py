"""Running a model: the exact executor (``exact``), the plain reference forward pass with every
activation (``forward``), the exported torch module in float32/float64 (``torch_run``).
"""
