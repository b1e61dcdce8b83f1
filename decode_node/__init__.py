import engine  # noqa: F401  (first: a compiled build of this package's modules, engine/compiled.py)
