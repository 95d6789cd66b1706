"""P2's MPC protocols and EMA programs run level by level: the protocol executor
(``protocol_run``), the EMA-program executor (``program_run``), the differential check (``check``).
"""
