"""What both node roles share, free of I/O: the ports a runtime implements
(clock, stage executor, outbox), the typed messages between the proxy and the
nodes, the step loop over a `NodeCore`, and the request intake. The KV
transport port and the fault policy are in `connector`."""

import engine  # noqa: F401  (first: a compiled build of this package's modules, engine/compiled.py)
