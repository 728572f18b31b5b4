"""Score: the policy that learns from real flows which node serves a target best (area K of
the requirements, ``docs/design/score.md``). Sans-I/O:
every function takes the time it acts at; the group manager and the reporters feed it."""
