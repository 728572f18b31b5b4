"""Simulation harness for group policies: scripted nodes, flows on a fake clock, metrics (issue 11)."""
