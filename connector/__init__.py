"""The KV handoff between prefill (producer) and decode (consumer) nodes.

`transport` is the port the nodes talk through and `pull_policy` the one
retry policy; `grpc/` implements the port on the wall clock, `link` models
an impaired network, `payload` makes and checks block contents.
"""

import engine  # noqa: F401  (first: a compiled build of this package's modules, engine/compiled.py)
