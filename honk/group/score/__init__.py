"""Score: the policy that learns from real flows which node serves a target best (seed 001,
"Score scoring and lifecycle"; area K of the groups-and-health requirements). Sans-I/O:
every function takes the time it acts at; the group manager and the reporters feed it."""
