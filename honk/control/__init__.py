"""Control plane: the reconciler through which every change to what runs passes (desired
state, plan, prepare, commit, drains), the health service that follows each published plane,
and the geodata updater."""
