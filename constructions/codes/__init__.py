"""Position codes (``positions``: Lemma 2, Reed-Solomon o Hadamard, random signs, one-hot), their
generators (``generators``), exact Gram certificates (``gram``, ``gram_cuda``) and inner products
read from the generators (``products``).
"""
