"""Leaf outbounds: the fixed ``Outbound`` contract (``base``), ``direct``,
``block``, a stand-in for protocols not dialable yet, and the registry that
builds them from a Spec."""
