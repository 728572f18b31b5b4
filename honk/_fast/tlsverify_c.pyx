# cython: language_level=3
"""A cache of verified certificate chains for client TLS contexts (compiled).

With OpenSSL 3.0 about a seventh of a TLS client's CPU per connection goes to
``X509_verify_cert`` (building the chain, checking the CA's signature over the
leaf, the names and the dates): 14 % of the benchmark's own OpenSSL Trojan client
against a v2ray server, by perf. A proxy that opens a thousand connections a
second to the same few servers verifies the same chain a thousand times. :func:`install` gives a
``ssl.SSLContext`` OpenSSL's certificate-verification hook
(``SSL_CTX_set_cert_verify_callback``): the hook verifies as OpenSSL would, and
remembers a success; a later handshake that presents the same chain for the
same name is accepted without verifying it again, for at most ``ttl`` seconds
and never past the earliest ``notAfter`` of the chain that was verified.

What a cached success is keyed on: the SHA-256 of every certificate the server
sent (the leaf and the untrusted rest, in order), the names the connection checks
(hosts and IP), and the verification flags, host flags and depth in force. The
trust store is the context's own: each context keeps its own cache (in its ex
data, freed with it), so a context must not change its trust after install
(honk's client contexts are built once, then shared). The server's
CertificateVerify signature, which proves it holds the key, is checked by
OpenSSL on every handshake as before; only the chain's verification is
remembered. Failures are never remembered.

The cache runs on whichever thread shakes hands (the relay engine's workers,
or the loop's thread with the GIL released); a mutex guards it.

:func:`prefer_builtin_keys` is the other half of a client handshake's certificate
cost. OpenSSL 3.0 decodes the public key of every certificate it parses (the
server's, at every full handshake) through its provider decoders, and building
the decoder context walks every decoder and key manager the providers offer:
about 90 µs a certificate on the benchmark machine, a fifth of honk's CPU per
Trojan connection against a v2ray server (which sends no session tickets by
default, so every handshake is a full one). OpenSSL still carries its built-in
EC key methods, and uses them for a key type that a registered ENGINE claims. The
function registers, once per process, an ENGINE whose EC method is an exact copy
of the built-in one: EC public keys then decode in about 23 µs, and ECDSA and
ECDH run OpenSSL's same EC code through the older interface. Only EC: the same
copy of the RSA method crashes OpenSSL 3.0 when a server signs with RSA-PSS.
Nothing is registered under a FIPS configuration (the built-in methods are
outside the FIPS provider) or when OpenSSL was built without ENGINE support.
"""

cdef extern from *:
    """
    #define OPENSSL_SUPPRESS_DEPRECATED  /* the ENGINE and EVP_PKEY_METHOD calls below */
    #include <openssl/ssl.h>
    #include <openssl/x509.h>
    #include <openssl/x509_vfy.h>
    #include <openssl/evp.h>
    #include <openssl/crypto.h>
    #include <openssl/err.h>
    #include <pthread.h>
    #include <string.h>
    #include <time.h>

    #define HONK_VC_SLOTS 64  /* chains one context remembers (a slot per key hash) */

    typedef struct { PyObject_HEAD SSL_CTX *ctx; } honk_pyctx_head;

    typedef struct {
        unsigned char key[32];
        double until;  /* CLOCK_MONOTONIC seconds (plus the skew) after which the slot is stale */
        int used;
    } honk_vc_slot;

    typedef struct {
        pthread_mutex_t mu;
        double ttl;
        unsigned long long hits, misses;
        honk_vc_slot slot[HONK_VC_SLOTS];
    } honk_vc;

    static int honk_vc_index = -1;
    static double honk_vc_skew = 0.0;  /* seconds added to both clocks (tests only) */

    static double honk_vc_mono(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + ts.tv_nsec * 1e-9 + honk_vc_skew;
    }

    static SSL_CTX *honk_ctx_of(PyObject *obj) {
        SSL_CTX *c;
        const SSL_METHOD *m;
        if (Py_TYPE(obj)->tp_basicsize < (Py_ssize_t)sizeof(honk_pyctx_head)) return NULL;
        c = ((honk_pyctx_head *)obj)->ctx;
        if (c == NULL) return NULL;
        m = SSL_CTX_get_ssl_method(c);
        if (m != TLS_client_method() && m != TLS_method()) return NULL;
        return c;
    }

    static void honk_vc_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp) {
        honk_vc *vc = (honk_vc *)ptr;
        (void)parent; (void)ad; (void)idx; (void)argl; (void)argp;
        if (vc != NULL) {
            pthread_mutex_destroy(&vc->mu);
            OPENSSL_free(vc);
        }
    }

    static int honk_vc_hash_cert(EVP_MD_CTX *md, X509 *x) {
        unsigned char der[EVP_MAX_MD_SIZE];
        unsigned int n = 0;
        if (!X509_digest(x, EVP_sha256(), der, &n)) return 0;
        return EVP_DigestUpdate(md, der, n);
    }

    /* The key of a chain as presented, for the names and flags this verification uses; 0 when
       it cannot be made (the chain is then verified and not remembered). */
    static int honk_vc_key(X509_STORE_CTX *ctx, unsigned char out[32]) {
        X509 *leaf = X509_STORE_CTX_get0_cert(ctx);
        STACK_OF(X509) *rest = X509_STORE_CTX_get0_untrusted(ctx);
        X509_VERIFY_PARAM *param = X509_STORE_CTX_get0_param(ctx);
        EVP_MD_CTX *md;
        unsigned long flags;
        unsigned int hostflags, n = 0;
        int depth, i, ok;
        char *host, *ip;
        if (leaf == NULL || param == NULL) return 0;
        ERR_set_mark();  /* what fails here is ours to drop, not the handshake's to report */
        if ((md = EVP_MD_CTX_new()) == NULL) {
            ERR_pop_to_mark();
            return 0;
        }
        ok = EVP_DigestInit_ex(md, EVP_sha256(), NULL) && honk_vc_hash_cert(md, leaf);
        for (i = 0; ok && rest != NULL && i < sk_X509_num(rest); i++)
            ok = EVP_DigestUpdate(md, "|", 1) && honk_vc_hash_cert(md, sk_X509_value(rest, i));
        for (i = 0; ok && (host = X509_VERIFY_PARAM_get0_host(param, i)) != NULL; i++)
            ok = EVP_DigestUpdate(md, "h", 1) && EVP_DigestUpdate(md, host, strlen(host) + 1);
        if (ok && (ip = X509_VERIFY_PARAM_get1_ip_asc(param)) != NULL) {
            ok = EVP_DigestUpdate(md, "i", 1) && EVP_DigestUpdate(md, ip, strlen(ip) + 1);
            OPENSSL_free(ip);
        }
        flags = X509_VERIFY_PARAM_get_flags(param);
        hostflags = X509_VERIFY_PARAM_get_hostflags(param);
        depth = X509_VERIFY_PARAM_get_depth(param);
        ok = ok && EVP_DigestUpdate(md, &flags, sizeof flags) && EVP_DigestUpdate(md, &hostflags, sizeof hostflags)
             && EVP_DigestUpdate(md, &depth, sizeof depth) && EVP_DigestFinal_ex(md, out, &n) && n == 32;
        EVP_MD_CTX_free(md);
        ERR_pop_to_mark();
        return ok;
    }

    /* Seconds until the earliest notAfter of the verified chain (wall clock), or -1. */
    static double honk_vc_valid_for(X509_STORE_CTX *ctx) {
        STACK_OF(X509) *chain = X509_STORE_CTX_get0_chain(ctx);
        double least = -1.0, left;
        struct tm tm;
        int i;
        time_t now = time(NULL) + (time_t)honk_vc_skew;
        if (chain == NULL) return -1.0;
        for (i = 0; i < sk_X509_num(chain); i++) {
            if (!ASN1_TIME_to_tm(X509_get0_notAfter(sk_X509_value(chain, i)), &tm)) return -1.0;
            left = difftime(timegm(&tm), now);
            if (least < 0.0 || left < least) least = left;
        }
        return least;
    }

    static int honk_vc_verify(X509_STORE_CTX *ctx, void *arg) {
        honk_vc *vc = (honk_vc *)arg;
        unsigned char key[32] = {0};
        honk_vc_slot *s;
        double now, valid;
        int keyed, hit, ok;
        keyed = honk_vc_key(ctx, key);
        s = &vc->slot[key[0] % HONK_VC_SLOTS];
        now = honk_vc_mono();
        pthread_mutex_lock(&vc->mu);
        hit = keyed && s->used && now < s->until && memcmp(s->key, key, 32) == 0;
        if (hit) vc->hits++; else vc->misses++;
        pthread_mutex_unlock(&vc->mu);
        if (hit) {
            X509_STORE_CTX_set_error(ctx, X509_V_OK);
            return 1;
        }
        ok = X509_verify_cert(ctx);
        if (ok == 1 && keyed && X509_STORE_CTX_get_error(ctx) == X509_V_OK) {
            valid = honk_vc_valid_for(ctx);
            if (valid > 0.0) {
                pthread_mutex_lock(&vc->mu);
                memcpy(s->key, key, 32);
                s->until = now + (valid < vc->ttl ? valid : vc->ttl);
                s->used = 1;
                pthread_mutex_unlock(&vc->mu);
            }
        }
        return ok;
    }

    /* 1: installed now, 0: already installed (the ttl is updated), -1: no memory or ex data. */
    static int honk_vc_install(SSL_CTX *c, double ttl) {
        honk_vc *vc;
        if (honk_vc_index < 0) {
            honk_vc_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, honk_vc_free);
            if (honk_vc_index < 0) return -1;
        }
        vc = (honk_vc *)SSL_CTX_get_ex_data(c, honk_vc_index);
        if (vc != NULL) {
            pthread_mutex_lock(&vc->mu);
            vc->ttl = ttl;
            pthread_mutex_unlock(&vc->mu);
            return 0;
        }
        vc = (honk_vc *)OPENSSL_zalloc(sizeof *vc);
        if (vc == NULL) return -1;
        pthread_mutex_init(&vc->mu, NULL);
        vc->ttl = ttl;
        if (!SSL_CTX_set_ex_data(c, honk_vc_index, vc)) {
            pthread_mutex_destroy(&vc->mu);
            OPENSSL_free(vc);
            return -1;
        }
        SSL_CTX_set_cert_verify_callback(c, honk_vc_verify, vc);
        return 1;
    }

    #ifndef OPENSSL_NO_ENGINE
    #include <openssl/engine.h>
    static EVP_PKEY_METHOD *honk_bk_ec = NULL;  /* the built-in EC method's copy, kept for the process */
    static const int honk_bk_nids[] = {EVP_PKEY_EC};

    static int honk_bk_pmeths(ENGINE *e, EVP_PKEY_METHOD **pmeth, const int **nids, int nid) {
        (void)e;
        if (pmeth == NULL) {
            *nids = honk_bk_nids;
            return 1;
        }
        *pmeth = nid == EVP_PKEY_EC ? honk_bk_ec : NULL;
        return *pmeth != NULL;
    }
    #endif

    static int honk_bk_state = 0;  /* 0: not tried, 1: registered, -1: refused (tried once) */

    /* Registers the ENGINE that claims EC keys for OpenSSL's built-in method; 1 when in effect. */
    static int honk_bk_install(void) {
    #ifndef OPENSSL_NO_ENGINE
        ENGINE *e = NULL;
        const EVP_PKEY_METHOD *builtin;
        if (honk_bk_state != 0) return honk_bk_state > 0;
        honk_bk_state = -1;
        if (EVP_default_properties_is_fips_enabled(NULL)) return 0;
        ERR_set_mark();
        builtin = EVP_PKEY_meth_find(EVP_PKEY_EC);
        if (builtin == NULL || (honk_bk_ec = EVP_PKEY_meth_new(EVP_PKEY_EC, 0)) == NULL) goto refused;
        EVP_PKEY_meth_copy(honk_bk_ec, builtin);
        if ((e = ENGINE_new()) == NULL || !ENGINE_set_id(e, "honk-builtin-ec")
            || !ENGINE_set_name(e, "OpenSSL's built-in EC key method (honk)")
            || !ENGINE_set_pkey_meths(e, honk_bk_pmeths) || !ENGINE_register_pkey_meths(e))
            goto refused;
        /* the engine stays for the process: OpenSSL's table holds it without a reference of its own */
        ERR_pop_to_mark();
        honk_bk_state = 1;
        return 1;
    refused:
        if (e != NULL) ENGINE_free(e);
        if (honk_bk_ec != NULL) EVP_PKEY_meth_free(honk_bk_ec);
        honk_bk_ec = NULL;
        ERR_pop_to_mark();
        return 0;
    #else
        honk_bk_state = -1;
        return 0;
    #endif
    }

    /* 1: the public key of the DER certificate decodes as a built-in key, 0: a provider's,
       -1: not a certificate with a public key. */
    static int honk_bk_decodes_builtin(const unsigned char *der, long n) {
        X509 *x;
        EVP_PKEY *key;
        int builtin = -1;
        ERR_set_mark();
        x = d2i_X509(NULL, &der, n);
        if (x != NULL && (key = X509_get0_pubkey(x)) != NULL)
            builtin = EVP_PKEY_get0_provider(key) == NULL;
        X509_free(x);
        ERR_pop_to_mark();
        return builtin;
    }

    static honk_vc *honk_vc_of(SSL_CTX *c) {
        return honk_vc_index < 0 ? NULL : (honk_vc *)SSL_CTX_get_ex_data(c, honk_vc_index);
    }

    static void honk_vc_counts(honk_vc *vc, unsigned long long *hits, unsigned long long *misses) {
        pthread_mutex_lock(&vc->mu);
        *hits = vc->hits;
        *misses = vc->misses;
        pthread_mutex_unlock(&vc->mu);
    }
    """
    ctypedef struct SSL_CTX:
        pass
    ctypedef struct honk_vc:
        pass
    SSL_CTX* honk_ctx_of(object obj)
    int honk_vc_install(SSL_CTX* c, double ttl)
    honk_vc* honk_vc_of(SSL_CTX* c)
    void honk_vc_counts(honk_vc* vc, unsigned long long* hits, unsigned long long* misses)
    double honk_vc_skew
    int honk_bk_install()
    int honk_bk_decodes_builtin(const unsigned char* der, long n)


cdef SSL_CTX* _ctx_of(context) except NULL:
    import ssl

    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"not an ssl.SSLContext: {type(context).__name__}")
    cdef SSL_CTX* c = honk_ctx_of(context)
    if c == NULL:
        raise ValueError("not a client SSLContext this module can read")
    return c


def install(context, double ttl):
    """Remember ``context``'s verified chains for ``ttl`` seconds (see the module docstring);
    True once installed (a second call only updates the ttl)."""
    if ttl <= 0:
        raise ValueError("ttl must be positive")
    if honk_vc_install(_ctx_of(context), ttl) < 0:
        raise MemoryError("could not attach the verification cache")
    return True


def stats(context):
    """``(hits, misses)`` of ``context``'s cache: handshakes whose chain was accepted from it,
    and verifications it made (``(0, 0)`` without a cache)."""
    cdef unsigned long long hits = 0, misses = 0
    cdef honk_vc* vc = honk_vc_of(_ctx_of(context))
    if vc != NULL:
        honk_vc_counts(vc, &hits, &misses)
    return int(hits), int(misses)


def _skew(double seconds):
    """Tests only: move both of the cache's clocks (ttl and notAfter) by ``seconds``."""
    global honk_vc_skew
    honk_vc_skew = seconds


def prefer_builtin_keys():
    """Decode and use EC keys with OpenSSL's built-in method from now on, process-wide (see the
    module docstring); True when that is in effect, False when OpenSSL refuses it (FIPS, no
    ENGINE support). Only the first call does anything."""
    return honk_bk_install() == 1


def _builtin_key(const unsigned char[:] der):
    """Tests and the kernel benchmark only: whether the DER certificate's public key decodes as a
    built-in key (not a provider's)."""
    cdef int builtin = honk_bk_decodes_builtin(&der[0], der.shape[0]) if der.shape[0] else -1
    if builtin < 0:
        raise ValueError("not a DER certificate with a public key")
    return builtin == 1
