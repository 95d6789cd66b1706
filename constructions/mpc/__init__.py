"""P2's MPC side: protocols (``protocol``), the protocol library (``library``), the compiler to EMA
programs (``compile``), EMA programs (``program``) and the applications' tasks (``applications``).
"""
