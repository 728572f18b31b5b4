"""The control surfaces on one aiohttp server: the Clash API for dashboards, the
native ``/v1`` API for ``honkctl`` and scripts, and Prometheus ``/metrics``."""
