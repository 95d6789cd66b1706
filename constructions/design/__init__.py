"""Design searches the builders share: the smallest eta and the format with the fewest bits
(``precision_search``), the two-layer family of Theorems 6 and 13 (``two_layer``).
"""
