"""P2's attention kernels: exact-match attention (``ema``) and ANNA with LSH (``anna``).
"""
