"""The node machinery of the wall-clock runtime, without Ray: the run
clock, framed TCP, delay lines, the proxy channel, the executors and stage
workers, and `WallNodeHost`, which gives a node role its wall-clock ports.
`cluster.ray` puts these into actors."""
