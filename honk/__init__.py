"""honk: a transparent-proxy router daemon for Linux."""

__version__ = "0.1.0"
