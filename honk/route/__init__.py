"""Routing: compiled, sans-I/O rules from a flow to an outbound name.

``Router.compile(routing)`` once per configuration; ``router.route(meta)`` per
flow. See :mod:`honk.route.router` for the resolution protocol.
"""

from honk.route.matchers import RouteCompileError
from honk.route.resolve import ResolveError, Resolver, ResolveTimeout, SystemResolver
from honk.route.router import NeedsResolution, RouteDecision, Router

__all__ = [
    "NeedsResolution",
    "ResolveError",
    "ResolveTimeout",
    "Resolver",
    "RouteCompileError",
    "RouteDecision",
    "Router",
    "SystemResolver",
]
