"""`disagg-sim serve`: the OpenAI-compatible front door (docs/serve.md)."""
