"""honkctl client and the PID lock."""
