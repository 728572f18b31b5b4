"""Geodata: the v2fly ``geosite.dat``/``geoip.dat`` lists (and ``ext:`` files in their format)
that ``domain(geosite: …)``, ``dip(geoip: …)`` and ``ext:"file.dat:tag"`` rules name, and
MaxMind/DB-IP ``.mmdb`` country databases for ``geoip:`` and ``ext:"file.mmdb:cn"``.

:mod:`honk.geo.dat` reads the protobuf files, :mod:`honk.geo.mmdb` walks a MaxMind DB's search
tree into a country's networks; :mod:`honk.geo.assets` finds them where dae and
upstream honk look, loads each file once per content, and answers a code as a
:class:`~honk.geo.assets.DomainList` or a :class:`~honk.geo.assets.NetworkList` that the route
matchers compile.
"""
