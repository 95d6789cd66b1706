"""The papers' lower bounds (``lower_bounds``), built sizes beside them (``sizes``) and their figures
(``figures``).
"""
