"""The daemon process: task tree, signals, reload and shutdown."""
