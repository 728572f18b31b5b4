"""Subscriptions: remote node lists fetched, parsed, stored and refreshed.

* :mod:`honk.subscription.formats`: body formats -> nodes (pure).
* :mod:`honk.subscription.fetch`: one HTTP(S) GET through an outbound.
* :mod:`honk.subscription.store`: the last accepted body per subscription (SQLite).
* :mod:`honk.subscription.manager`: restore, fetch, refresh and publish nodes.
"""
