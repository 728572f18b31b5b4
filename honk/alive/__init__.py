"""Node health: the six liveness states per node, probes through each node, and their schedules."""
