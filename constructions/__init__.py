"""exactformer.constructions"""
