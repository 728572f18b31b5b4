"""honk's DNS: the service a router's LAN is pointed at (or whose port 53 is intercepted).

* ``service.py`` ``DnsService``: one query in, one reply out; request rules, cache, upstream
  exchanges through honk's routing, learning which names resolved to which IPs.
* ``listener.py`` ``DnsListener``: the standalone ``dns.bind`` listener (UDP, TCP).
* ``cache.py`` ``DnsCache`` and ``learning.py`` ``DomainLearning``: state that outlives a
  configuration (a reload rebuilds the service over them).
* ``upstream.py``: one exchange (direct UDP, TCP DNS, through a proxy leaf, or an encrypted
  transport); ``endpoint.py``: what an upstream URL says (scheme, port, DoH path, TLS name);
  ``encrypted.py``: DoT and DoH over one reused connection per upstream; ``quic.py``: DoQ and
  DoH over HTTP/3 (aioquic); ``failure.py``: the typed exchange failures; ``rules.py``: request
  and response routing; ``wire.py``: the wire format around dnspython.

dnspython loads with this package, so the daemon imports it only when a ``dns`` section exists.
"""
