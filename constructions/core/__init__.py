"""The core of what is built: the model IR (``ir``), residual slots and assembly (``builder``),
tasks (``task``), specifications (``spec``), the registry (``registry``), views of the residual
stream (``views``, ``views_ops``).
"""
