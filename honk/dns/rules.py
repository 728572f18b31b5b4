"""DNS request routing: the first rule whose conditions all hold picks the action.

Conditions are ANDed; a condition's arguments are ORed; ``!`` negates one
condition. qname arguments: ``suffix`` on a label boundary (``cn`` matches
``cn`` and ``a.cn``, not ``acn``), ``keyword`` a substring, ``full`` the exact
name. qname is read lower-cased without its trailing dot.
"""

from __future__ import annotations

from collections.abc import Sequence

from honk.config.spec import DNS_QTYPE_ANY, DnsCondition, DnsRequestRule

__all__ = ["RequestRouter", "condition_holds", "qname_matches"]


def qname_matches(key: str, value: str, qname: str) -> bool:
    if key == "full":
        return qname == value
    if key == "keyword":
        return value in qname
    return qname == value or qname.endswith("." + value)  # suffix


def condition_holds(condition: DnsCondition, qname: str, qtype: int) -> bool:
    if condition.kind == "qname":
        hit = any(qname_matches(arg.key, arg.value, qname) for arg in condition.names)
    else:
        hit = any(t == DNS_QTYPE_ANY or t == qtype for t in condition.qtypes)
    return hit != condition.negated


class RequestRouter:
    """The compiled request rules of one DNS spec."""

    def __init__(self, rules: Sequence[DnsRequestRule], fallback: str) -> None:
        self._rules = tuple(rules)
        self.fallback = fallback

    def decide(self, qname: str, qtype: int) -> str:
        """``reject``, ``asis`` or an upstream name."""
        for rule in self._rules:
            if all(condition_holds(c, qname, qtype) for c in rule.conditions):
                return rule.action
        return self.fallback
