"""Command-line entry points: ``honk`` (the daemon) and ``honkctl`` (the control client)."""
