"""One module per theorem of the two papers; each registers its constructions with
``@construction`` (the registry imports every module of this package).
"""
