"""The certificate for all inputs, composed from the blocks' local certificates (``composed``).
"""
