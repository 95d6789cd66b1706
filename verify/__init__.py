"""exactformer.verify"""
