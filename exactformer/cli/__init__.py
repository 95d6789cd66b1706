"""The ``exactformer`` command line, above the API: the app (``main``), build and verify
(``commands``), construction options (``options``), output (``output``), the other commands
(``positions``, ``sizes``, ``attention``) and the generated docs/cli.md tables (``docs``).
"""
