"""Control plane: the reconciler through which every change to what runs passes
(desired state, plan, prepare, commit, drains), the routing mode, and the state
that outlives a restart."""
