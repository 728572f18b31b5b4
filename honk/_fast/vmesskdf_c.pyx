# cython: language_level=3
"""VMess AEAD's key derivation over OpenSSL's SHA-256: the compiled twin of ``vmesskdf_py``.

The same construction (see there), with each layer's message built in a buffer on the stack
and the root HMAC started from two SHA-256 states that absorbed the padded root key once (a
state is a plain struct: copying it costs nothing). A request header's four keys take about
a quarter of the twin's time. Paths deeper than :data:`MAX_SALTS` (the protocol uses three)
go to the twin.
"""

from honk._fast.vmesskdf_py import KDF_ROOT
from honk._fast.vmesskdf_py import kdf as _twin_kdf

__all__ = ["KDF_ROOT", "kdf"]

cdef extern from *:
    """
    #define OPENSSL_SUPPRESS_DEPRECATED 1  /* SHA256_CTX: a copyable state, what the layers need */
    #include <openssl/sha.h>
    #include <openssl/crypto.h>
    #include <stdlib.h>
    #include <string.h>
    #define HONK_KDF_MAX_SALTS 8
    #define HONK_KDF_STACK 256
    static SHA256_CTX honk_kdf_in, honk_kdf_out;
    static void honk_kdf_setup(const unsigned char *root, size_t n) {
        unsigned char pad[64];
        size_t i;
        memset(pad, 0x36, 64);
        for (i = 0; i < n && i < 64; i++) pad[i] ^= root[i];
        SHA256_Init(&honk_kdf_in);
        SHA256_Update(&honk_kdf_in, pad, 64);
        memset(pad, 0x5c, 64);
        for (i = 0; i < n && i < 64; i++) pad[i] ^= root[i];
        SHA256_Init(&honk_kdf_out);
        SHA256_Update(&honk_kdf_out, pad, 64);
    }
    /* Layer `depth` over msg into out (32 bytes): 0 is HMAC-SHA256 under the root key, n is the
       HMAC keyed by salts[n-1] whose hash function is layer n-1. 0, or -1 (no memory). */
    static int honk_kdf_layer(int depth, const unsigned char *const *salts, const size_t *lens,
                              const unsigned char *msg, size_t mlen, unsigned char *out) {
        unsigned char key[64], hashed[32], inner[32], outer[64 + 32], stack[HONK_KDF_STACK];
        unsigned char *buf = stack;
        const unsigned char *salt;
        size_t slen, i;
        int rc;
        if (depth == 0) {
            SHA256_CTX c = honk_kdf_in;
            SHA256_Update(&c, msg, mlen);
            SHA256_Final(inner, &c);
            c = honk_kdf_out;
            SHA256_Update(&c, inner, 32);
            SHA256_Final(out, &c);
            OPENSSL_cleanse(inner, sizeof inner);
            return 0;
        }
        salt = salts[depth - 1];
        slen = lens[depth - 1];
        if (slen > 64) {  /* a key longer than the block is hashed, by the layer below */
            if (honk_kdf_layer(depth - 1, salts, lens, salt, slen, hashed) < 0) return -1;
            salt = hashed;
            slen = 32;
        }
        memset(key, 0, 64);
        memcpy(key, salt, slen);
        if (64 + mlen > sizeof stack) {
            buf = malloc(64 + mlen);
            if (buf == NULL) return -1;
        }
        for (i = 0; i < 64; i++) buf[i] = key[i] ^ 0x36;
        memcpy(buf + 64, msg, mlen);
        rc = honk_kdf_layer(depth - 1, salts, lens, buf, 64 + mlen, inner);
        if (rc == 0) {
            for (i = 0; i < 64; i++) outer[i] = key[i] ^ 0x5c;
            memcpy(outer + 64, inner, 32);
            rc = honk_kdf_layer(depth - 1, salts, lens, outer, sizeof outer, out);
        }
        OPENSSL_cleanse(buf, 64 + mlen);
        if (buf != stack) free(buf);
        OPENSSL_cleanse(key, sizeof key);
        OPENSSL_cleanse(inner, sizeof inner);
        OPENSSL_cleanse(outer, sizeof outer);
        return rc;
    }
    """
    int HONK_KDF_MAX_SALTS
    void honk_kdf_setup(const unsigned char* root, size_t n)
    int honk_kdf_layer(int depth, const unsigned char** salts, const size_t* lens,
                       const unsigned char* msg, size_t mlen, unsigned char* out)

MAX_SALTS = HONK_KDF_MAX_SALTS  # salts in one path the compiled layers take

cdef bytes _root = bytes(KDF_ROOT)
honk_kdf_setup(<const unsigned char*><char*>_root, len(_root))


def kdf(key, *path):
    """v2ray's VMess KDF over ``key`` with the salts of ``path``; 32 bytes (as the twin's)."""
    cdef const unsigned char* salts[8]
    cdef size_t lens[8]
    cdef unsigned char out[32]
    cdef bytes k = bytes(key)
    cdef bytes s
    cdef int i, n = len(path)
    if n > HONK_KDF_MAX_SALTS:
        return _twin_kdf(key, *path)
    held = [bytes(p) for p in path]  # the buffers the pointers point into, alive until the end
    for i in range(n):
        s = held[i]
        salts[i] = <const unsigned char*><char*>s
        lens[i] = len(s)
    if honk_kdf_layer(n, salts, lens, <const unsigned char*><char*>k, len(k), out) < 0:
        raise MemoryError()
    return (<char*>out)[:32]
