"""exactformer.precision"""
