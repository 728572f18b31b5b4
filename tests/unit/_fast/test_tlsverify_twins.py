"""The verified-chain cache of client TLS contexts (honk._fast.tlsverify): a handshake that
presents a chain verified before, for the same names, skips ``X509_verify_cert``; nothing
else about any handshake changes. Real OpenSSL handshakes, client and server in memory
(MemoryBIOs), certificates from CAs made here (trustme). The twin remembers nothing; both
implementations must give every handshake the outcome OpenSSL gives it without a cache."""

from __future__ import annotations

import datetime
import importlib
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS, tlsverify, tlsverify_py
from honk.outbound.tls import client_context

TTL = 60.0
IMPLS = [pytest.param("py", id="py")]
if not NO_EXTENSIONS:  # the twin run has no compiled module to compare
    IMPLS.append(pytest.param("c", id="c", marks=pytest.mark.compiled))
NAMES = ("localhost", "api.localhost", "127.0.0.1", "example.com")  # the last: in no certificate


class Servers:
    """Servers (server contexts) with certificates from a trusted CA and from a stranger."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        stranger = trustme.CA()
        self.contexts = {
            "trusted": self._server(self.ca.issue_cert("localhost", "api.localhost", "127.0.0.1")),
            "trusted-rsa": self._server(self.ca.issue_cert("localhost", key_type=trustme.KeyType.RSA)),
            "stranger": self._server(stranger.issue_cert("localhost", "127.0.0.1")),
        }

    @staticmethod
    def _server(leaf: trustme.LeafCert) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        leaf.configure_cert(context)
        return context

    def client(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.ca.configure_trust(context)
        return context


def shake(client: ssl.SSLContext, server: ssl.SSLContext, name: str) -> str:
    """A full handshake in memory: "ok", or the client's verification failure."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    near = client.wrap_bio(c_in, c_out, server_hostname=name)
    far = server.wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for i, (end, out, peer_in) in enumerate(((near, c_out, s_in), (far, s_out, c_in))):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLCertVerificationError as exc:
                    return f"refused: {exc.verify_message}"
                except ssl.SSLError:
                    if i == 1:  # the server read the client's alert: the client's failure says why
                        continue
                    raise
            peer_in.write(out.read())
        if all(done):
            return "ok"
    raise AssertionError("the handshake did not finish")


def load(impl: str):  # noqa: ANN201 - one implementation; a missing compiled build fails the test
    return importlib.import_module(f"honk._fast.tlsverify_{impl}")


@pytest.fixture(scope="module")
def servers() -> Servers:
    return Servers()


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest):  # noqa: ANN201 - the module under test
    return load(request.param)


@pytest.fixture
def skew() -> Iterator[object]:
    """The compiled cache's clocks, moved by a test and put back after it."""
    module = load("c")
    yield module._skew
    module._skew(0.0)


compiled = pytest.mark.parametrize("impl", [p for p in IMPLS if p.id == "c"], indirect=True)


def test_both_refuse_what_is_not_a_client_context_or_a_positive_ttl(impl) -> None:
    with pytest.raises(TypeError):
        impl.install(object(), TTL)
    with pytest.raises(TypeError):
        impl.stats("context")
    with pytest.raises(ValueError):
        impl.install(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), 0.0)


def test_the_twin_remembers_nothing(servers: Servers) -> None:
    client = servers.client()
    assert tlsverify_py.install(client, TTL) is False
    assert [shake(client, servers.contexts["trusted"], "localhost") for _ in range(3)] == ["ok"] * 3
    assert tlsverify_py.stats(client) == (0, 0)


@compiled
def test_a_chain_verified_once_is_accepted_again_without_verifying_it(impl, servers: Servers) -> None:
    client = servers.client()
    assert impl.install(client, TTL) is True
    assert impl.stats(client) == (0, 0)
    assert [shake(client, servers.contexts["trusted"], "localhost") for _ in range(4)] == ["ok"] * 4
    assert impl.stats(client) == (3, 1)


@compiled
def test_a_remembered_chain_is_verified_again_for_another_name(impl, servers: Servers) -> None:
    client = servers.client()
    impl.install(client, TTL)
    assert shake(client, servers.contexts["trusted"], "localhost") == "ok"
    assert shake(client, servers.contexts["trusted"], "api.localhost") == "ok"
    assert shake(client, servers.contexts["trusted"], "example.com").startswith("refused: Hostname mismatch")
    assert shake(client, servers.contexts["trusted"], "example.com").startswith("refused: Hostname mismatch")
    assert impl.stats(client) == (0, 4)  # no name borrowed another's verification; no failure kept


@compiled
def test_another_chain_for_the_same_name_is_verified_in_full(impl, servers: Servers) -> None:
    client = servers.client()
    impl.install(client, TTL)
    assert shake(client, servers.contexts["trusted"], "localhost") == "ok"
    assert shake(client, servers.contexts["stranger"], "localhost").startswith(
        "refused: unable to get local issuer"
    )
    assert shake(client, servers.contexts["trusted-rsa"], "localhost") == "ok"
    assert impl.stats(client) == (0, 3)


@compiled
def test_a_remembered_chain_is_verified_again_after_the_ttl(impl, servers: Servers, skew) -> None:
    client = servers.client()
    impl.install(client, TTL)
    assert shake(client, servers.contexts["trusted"], "localhost") == "ok"
    skew(TTL - 1.0)
    assert shake(client, servers.contexts["trusted"], "localhost") == "ok"
    assert impl.stats(client) == (1, 1)
    skew(TTL + 1.0)
    assert shake(client, servers.contexts["trusted"], "localhost") == "ok"
    assert impl.stats(client) == (1, 2)


@compiled
def test_a_chain_is_never_accepted_past_its_not_after(impl, skew) -> None:
    ca = trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    server = Servers._server(ca.issue_cert("localhost", not_after=now + datetime.timedelta(seconds=30)))
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    impl.install(client, TTL)  # the ttl alone would outlive the certificate
    assert shake(client, server, "localhost") == "ok"
    skew(20.0)
    assert shake(client, server, "localhost") == "ok"
    assert impl.stats(client) == (1, 1)
    skew(40.0)  # past notAfter on the cache's clock (OpenSSL's own has not moved): verified again
    assert shake(client, server, "localhost") == "ok"
    assert impl.stats(client) == (1, 2)


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(("trusted", "trusted-rsa", "stranger")), st.sampled_from(NAMES)),
        min_size=1,
        max_size=8,
    )
)
def test_every_handshake_ends_as_it_ends_without_a_cache(
    servers: Servers, steps: list[tuple[str, str]]
) -> None:
    plain = servers.client()
    cached = {p.id: servers.client() for p in IMPLS}
    for name, context in cached.items():
        load(name).install(context, TTL)
    for server, name in steps:
        expected = shake(plain, servers.contexts[server], name)
        for context in cached.values():
            assert shake(context, servers.contexts[server], name) == expected, (server, name)


def test_honk_keeps_the_chains_its_verifying_contexts_accept_and_no_others(
    servers: Servers, tmp_path
) -> None:
    ca_file = tmp_path / "ca.pem"
    servers.ca.cert_pem.write_to_path(str(ca_file))
    verifying = client_context(True, (), str(ca_file), "node", 0.0)
    lax = client_context(False, (), str(ca_file), "node", 0.0)
    for context in (verifying, lax):
        assert [shake(context, servers.contexts["trusted"], "localhost") for _ in range(3)] == ["ok"] * 3
    assert tlsverify.stats(lax) == (0, 0)
    assert tlsverify.stats(verifying) == ((2, 1) if tlsverify.IMPLEMENTATION == "compiled" else (0, 0))
    assert shake(verifying, servers.contexts["stranger"], "localhost").startswith("refused:")


# Built-in EC keys (prefer_builtin_keys) change which OpenSSL code decodes and uses a key for the
# rest of a process, so each side of the comparison runs in a process of its own.
HANDSHAKES = r"""
import json, ssl, sys
sys.path.insert(0, sys.argv[3])
from test_tlsverify_twins import shake
import importlib
impl = importlib.import_module("honk._fast.tlsverify_" + sys.argv[2])
KINDS = ("ec", "rsa", "ec-forged", "ec-chain")
d = sys.argv[1]
prefers = impl.prefer_builtin_keys()
out = {"prefers": prefers, "builtin": {}, "handshakes": []}
END = "-----END CERTIFICATE-----"
for kind in KINDS:
    leaf = open(f"{d}/{kind}.pem").read().split(END)[0] + END + "\n"  # the server's chain starts with its own
    out["builtin"][kind] = impl._builtin_key(ssl.PEM_cert_to_DER_cert(leaf))
    for curve in (None, "prime256v1", "secp384r1", "secp521r1"):  # None: X25519, the default
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(f"{d}/{kind}.pem", f"{d}/{kind}.key")
        if curve:
            server.set_ecdh_curve(curve)
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            client.load_verify_locations(f"{d}/ca.pem")
            client.maximum_version = version
            out["handshakes"].append([kind, curve, version.name, shake(client, server, "localhost")])
print(json.dumps(out))
"""


def _handshakes_in_a_process(directory: Path, impl: str, prefer: bool) -> dict[str, object]:
    script = HANDSHAKES if prefer else HANDSHAKES.replace("impl.prefer_builtin_keys()", "False")
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory), impl, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # a crash inside OpenSSL shows here
    return json.loads(done.stdout)


def _ecdsa_chain(directory: Path) -> None:
    """``ec-chain``: the shape of Let's Encrypt's ECDSA chain (letsencrypt.org/certificates): a
    P-384 root (as ISRG Root X2) signs a P-384 intermediate (as E5/E6) that signs a P-256 leaf.
    The server sends the leaf and the intermediate; the root joins the client's trust file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: str,
        signer: ec.EllipticCurvePrivateKey,
        ca: bool,
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=90))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
            )
        return builder.sign(signer, hashes.SHA384())  # every signer here is P-384, as E5 and X2

    root_key, mid_key, leaf_key = (
        ec.generate_private_key(ec.SECP384R1()),
        ec.generate_private_key(ec.SECP384R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    root = issue("Test Root X2", root_key, "Test Root X2", root_key, ca=True)
    mid = issue("Test E5", mid_key, "Test Root X2", root_key, ca=True)
    leaf = issue("localhost", leaf_key, "Test E5", mid_key, ca=False)
    pem = serialization.Encoding.PEM
    (directory / "ec-chain.pem").write_bytes(leaf.public_bytes(pem) + mid.public_bytes(pem))
    (directory / "ec-chain.key").write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with (directory / "ca.pem").open("ab") as trust:
        trust.write(root.public_bytes(pem))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An EC and an RSA server certificate from one CA, the EC one with its signature spoilt
    (one bit of the CA's signature flipped; the server still holds the key), and an ECDSA
    chain as Let's Encrypt issues them (:func:`_ecdsa_chain`)."""
    directory = tmp_path_factory.mktemp("builtin-keys")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    for kind, key_type in (("ec", trustme.KeyType.ECDSA), ("rsa", trustme.KeyType.RSA)):
        leaf = ca.issue_cert("localhost", key_type=key_type)
        leaf.cert_chain_pems[0].write_to_path(str(directory / f"{kind}.pem"))
        leaf.private_key_pem.write_to_path(str(directory / f"{kind}.key"))
    der = bytearray(ssl.PEM_cert_to_DER_cert((directory / "ec.pem").read_text()))
    der[-1] ^= 0x01  # the last byte of the signature's s
    (directory / "ec-forged.pem").write_text(ssl.DER_cert_to_PEM_cert(bytes(der)))
    (directory / "ec-forged.key").write_bytes((directory / "ec.key").read_bytes())
    _ecdsa_chain(directory)
    return directory


@compiled
def test_builtin_ec_keys_decode_a_certificate_without_the_providers_once_preferred(
    impl, certificates
) -> None:
    before = _handshakes_in_a_process(certificates, "c", prefer=False)
    after = _handshakes_in_a_process(certificates, "c", prefer=True)
    assert before["builtin"] == {"ec": False, "rsa": False, "ec-forged": False, "ec-chain": False}
    assert after["prefers"] is True
    # RSA stays with the providers
    assert after["builtin"] == {"ec": True, "rsa": False, "ec-forged": True, "ec-chain": True}


@compiled
def test_handshakes_over_builtin_ec_keys_end_as_they_end_over_the_providers(impl, certificates) -> None:
    """Every pairing of certificate key, key exchange group and TLS version: signing (server),
    verifying the chain and the handshake signature (client), ECDH on both ends."""
    providers = _handshakes_in_a_process(certificates, "c", prefer=False)
    builtin = _handshakes_in_a_process(certificates, "c", prefer=True)
    assert builtin["prefers"] is True and builtin["builtin"]["ec"] is True  # the built-in keys did the work
    assert providers["builtin"]["ec"] is False
    assert builtin["handshakes"] == providers["handshakes"]
    outcomes = {(kind, result) for kind, _curve, _version, result in builtin["handshakes"]}
    assert outcomes == {
        ("ec", "ok"),
        ("rsa", "ok"),
        ("ec-forged", "refused: certificate signature failure"),
        ("ec-chain", "ok"),
    }
    assert len(builtin["handshakes"]) == 4 * 4 * 2


def test_the_twin_cannot_prefer_builtin_keys(certificates) -> None:
    twin = _handshakes_in_a_process(certificates, "py", prefer=True)
    assert twin["prefers"] is False
    assert tlsverify_py.prefer_builtin_keys() is False
    assert tlsverify_py._builtin_key(ssl.PEM_cert_to_DER_cert((certificates / "ec.pem").read_text())) is False


@compiled
def test_honk_client_contexts_turn_builtin_ec_keys_on(impl, certificates) -> None:
    """The first client context honk builds prefers the built-in EC keys, in a fresh process."""
    script = (
        "import ssl, sys\n"
        "from honk._fast import tlsverify_c\n"
        "from honk.outbound.tls import client_context\n"
        "der = ssl.PEM_cert_to_DER_cert(open(sys.argv[1]).read())\n"
        "before = tlsverify_c._builtin_key(der)\n"
        "client_context(True, (), sys.argv[2], 'node', 0.0)\n"
        "print(before, tlsverify_c._builtin_key(der))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(certificates / "ec.pem"), str(certificates / "ca.pem")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
