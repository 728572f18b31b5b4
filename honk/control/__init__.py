"""Control plane: state that outlives a restart and the interfaces that change it."""
