"""The v2fly geodata files: ``GeoSiteList`` and ``GeoIPList`` protobuf messages.

The schema is v2ray's router ``Domain``/``CIDR``/``GeoIP``/``GeoSite`` messages (the same field
numbers in v2fly, Xray and dae): built here at import from a descriptor, so no generated code and
no ``protoc`` are needed, and read with the protobuf runtime. ``Domain.Type`` says how a value
matches: PLAIN a substring, REGEX a regular expression, DOMAIN the name and every name under it,
FULL the name alone.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

# Domain.Type values
PLAIN = 0
REGEX = 1
DOMAIN = 2
FULL = 3

_PACKAGE = "honk.geodata"
_T = descriptor_pb2.FieldDescriptorProto


class GeoDataError(ValueError):
    """A geodata file or code that cannot serve a rule; ``code`` names the kind for diagnostics."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _field(
    message: Any,
    name: str,
    number: int,
    kind: int,
    *,
    repeated: bool = False,
    type_name: str = "",
    oneof: int | None = None,
) -> None:
    f = message.field.add(
        name=name, number=number, type=kind, label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL
    )
    if type_name:
        f.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="honk/geodata.proto", package=_PACKAGE, syntax="proto3")
    domain = file.message_type.add(name="Domain")
    kind = domain.enum_type.add(name="Type")
    for name, number in (("Plain", PLAIN), ("Regex", REGEX), ("Domain", DOMAIN), ("Full", FULL)):
        kind.value.add(name=name, number=number)
    attribute = domain.nested_type.add(name="Attribute")
    attribute.oneof_decl.add(name="typed_value")
    _field(attribute, "key", 1, _T.TYPE_STRING)
    _field(attribute, "bool_value", 2, _T.TYPE_BOOL, oneof=0)
    _field(attribute, "int_value", 3, _T.TYPE_INT64, oneof=0)
    _field(domain, "type", 1, _T.TYPE_ENUM, type_name="Domain.Type")
    _field(domain, "value", 2, _T.TYPE_STRING)
    _field(domain, "attribute", 3, _T.TYPE_MESSAGE, repeated=True, type_name="Domain.Attribute")
    cidr = file.message_type.add(name="CIDR")
    _field(cidr, "ip", 1, _T.TYPE_BYTES)
    _field(cidr, "prefix", 2, _T.TYPE_UINT32)
    geoip = file.message_type.add(name="GeoIP")
    _field(geoip, "country_code", 1, _T.TYPE_STRING)
    _field(geoip, "cidr", 2, _T.TYPE_MESSAGE, repeated=True, type_name="CIDR")
    _field(geoip, "reverse_match", 3, _T.TYPE_BOOL)
    geoip_list = file.message_type.add(name="GeoIPList")
    _field(geoip_list, "entry", 1, _T.TYPE_MESSAGE, repeated=True, type_name="GeoIP")
    geosite = file.message_type.add(name="GeoSite")
    _field(geosite, "country_code", 1, _T.TYPE_STRING)
    _field(geosite, "domain", 2, _T.TYPE_MESSAGE, repeated=True, type_name="Domain")
    geosite_list = file.message_type.add(name="GeoSiteList")
    _field(geosite_list, "entry", 1, _T.TYPE_MESSAGE, repeated=True, type_name="GeoSite")
    return file


def _classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(_schema().SerializeToString())
    make = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
    factory = None if make is not None else message_factory.MessageFactory(pool)  # Debian 12's 3.21
    out = {}
    for name in ("Domain", "CIDR", "GeoIP", "GeoIPList", "GeoSite", "GeoSiteList"):
        desc = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
        out[name] = make(desc) if make is not None else factory.GetPrototype(desc)  # type: ignore[union-attr]
    return out


_CLASSES = _classes()
Domain = _CLASSES["Domain"]
CIDR = _CLASSES["CIDR"]
GeoIP = _CLASSES["GeoIP"]
GeoIPList = _CLASSES["GeoIPList"]
GeoSite = _CLASSES["GeoSite"]
GeoSiteList = _CLASSES["GeoSiteList"]


def _entries(message_class: type, data: bytes, what: str) -> dict[str, Any]:
    """The file's entries by lower-cased code (the first of a code wins, as v2ray loads them)."""
    parsed = message_class()
    try:
        parsed.ParseFromString(data)
    except DecodeError as exc:
        raise GeoDataError("geodata-unreadable", f"not a {what} file: {exc}") from None
    out: dict[str, Any] = {}
    for entry in parsed.entry:
        out.setdefault(entry.country_code.lower(), entry)
    return out


def read_geosite(data: bytes) -> dict[str, Any]:
    """``code -> GeoSite`` of a ``geosite.dat`` (or an ``ext:`` file in its format)."""
    return _entries(GeoSiteList, data, "geosite")


def read_geoip(data: bytes) -> dict[str, Any]:
    """``code -> GeoIP`` of a ``geoip.dat`` (or an ``ext:`` file in its format)."""
    return _entries(GeoIPList, data, "geoip")
