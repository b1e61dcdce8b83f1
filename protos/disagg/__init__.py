"""Generated code for the `disagg` proto package (see protos/generate.py)."""
