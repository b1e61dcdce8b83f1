"""Validation of the cost model against published vLLM serving measurements.

`published.yaml` holds the measurements with their sources (dataset.py reads
it); simulate.py re-runs each in-process as published; report.py writes
docs/validation.md; cli.py is `disagg-sim validate-cost`.
"""
