# Included by relay_c.pyx. Shadowsocks AEAD (SIP004) and VMess chunk framing of the relay
# engine: the ciphers (OpenSSL EVP), building a flow's Aead state from its framing, and the
# worker's steps for a framed flow (seal what the client sent, open what the upstream sent).

# Shadowsocks AEAD (SIP004) on OpenSSL's EVP interface: the worker seals and opens chunks
# with these, without the GIL; nothing here allocates per chunk.
cdef extern from *:
    """
    #include <openssl/crypto.h>
    #include <openssl/err.h>
    #include <openssl/evp.h>
    /* SIP004: nonces are 12-byte little-endian counters, one step per AEAD operation */
    static inline void honk_nonce_next(uint8_t *n) {
        for (int i = 0; i < 12; i++) if (++n[i]) break;
    }
    /* out = seal(in[0:n]) followed by the 16-byte tag; 0, or -1 if OpenSSL failed */
    static int honk_seal(EVP_CIPHER_CTX *ctx, uint8_t *nonce, const uint8_t *in, int n, uint8_t *out) {
        int len;
        if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
        if (n > 0 && EVP_EncryptUpdate(ctx, out, &len, in, n) != 1) return -1;
        if (EVP_EncryptFinal_ex(ctx, out + n, &len) != 1) return -1;
        if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, out + n) != 1) return -1;
        honk_nonce_next(nonce);
        return 0;
    }
    /* out[0:n] = open(in[0:n]), checked against the tag at in[n:n+16]; 0, or -1 if it does not verify */
    static int honk_open(EVP_CIPHER_CTX *ctx, uint8_t *nonce, const uint8_t *in, int n, uint8_t *out) {
        int len;
        uint8_t tag[16];
        memcpy(tag, in + n, 16);
        if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
        if (n > 0 && EVP_DecryptUpdate(ctx, out, &len, in, n) != 1) return -1;
        if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag) != 1) return -1;
        if (EVP_DecryptFinal_ex(ctx, out + n, &len) != 1) return -1;
        honk_nonce_next(nonce);
        return 0;
    }
    /* the subkey for salt: HKDF-SHA1(key=master, salt, info="ss-subkey") of len bytes (RFC 5869:
       one HMAC to extract, one per 20-byte block to expand) */
    /* Algorithms fetched once at import (honk_crypto_init, under the GIL): OpenSSL 3's one-shot
       HMAC() and the EVP_sha1()/EVP_aes_*() handles look the algorithm up in the provider store
       at every use, which cost more than the whole key derivation. NULL: fall back to those. */
    static EVP_MD *honk_sha1_md = NULL;
    static EVP_CIPHER *honk_fetched_ciphers[4] = {NULL, NULL, NULL, NULL};
    static void honk_crypto_init(void) {
        if (honk_sha1_md == NULL) honk_sha1_md = EVP_MD_fetch(NULL, "SHA1", NULL);
        if (honk_fetched_ciphers[1] == NULL) honk_fetched_ciphers[1] = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
        if (honk_fetched_ciphers[2] == NULL) honk_fetched_ciphers[2] = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
        if (honk_fetched_ciphers[3] == NULL) honk_fetched_ciphers[3] = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
        ERR_clear_error();  /* a provider without one of them leaves an error behind */
    }
    /* HMAC-SHA1 (RFC 2104) of msg under a key of at most 64 bytes, on ctx; 0, or -1 */
    static int honk_hmac_sha1(EVP_MD_CTX *ctx, const uint8_t *key, size_t klen,
                              const uint8_t *msg, size_t mlen, uint8_t *out) {
        const EVP_MD *md = honk_sha1_md != NULL ? honk_sha1_md : EVP_sha1();
        uint8_t pad[64], inner[20];
        unsigned int n = 0;
        int rc = -1;
        size_t i;
        memset(pad, 0x36, 64);
        for (i = 0; i < klen; i++) pad[i] ^= key[i];
        if (EVP_DigestInit_ex(ctx, md, NULL) != 1 || EVP_DigestUpdate(ctx, pad, 64) != 1
            || EVP_DigestUpdate(ctx, msg, mlen) != 1 || EVP_DigestFinal_ex(ctx, inner, &n) != 1) goto done;
        memset(pad, 0x5c, 64);
        for (i = 0; i < klen; i++) pad[i] ^= key[i];
        if (EVP_DigestInit_ex(ctx, md, NULL) != 1 || EVP_DigestUpdate(ctx, pad, 64) != 1
            || EVP_DigestUpdate(ctx, inner, 20) != 1 || EVP_DigestFinal_ex(ctx, out, &n) != 1) goto done;
        rc = 0;
    done:
        OPENSSL_cleanse(pad, sizeof(pad));
        OPENSSL_cleanse(inner, sizeof(inner));
        return rc;
    }
    static int honk_ss_subkey(const uint8_t *master, int len, const uint8_t *salt, uint8_t *out) {
        uint8_t prk[20], block[20], t[20 + 9 + 1];
        int done = 0, prev = 0, take, rc = 0;
        uint8_t i = 1;
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        if (ctx == NULL) return -1;
        if (honk_hmac_sha1(ctx, salt, (size_t)len, master, (size_t)len, prk) < 0) rc = -1;
        while (rc == 0 && done < len) {
            if (prev) memcpy(t, block, 20);
            memcpy(t + prev, "ss-subkey", 9);
            t[prev + 9] = i++;
            if (honk_hmac_sha1(ctx, prk, 20, t, (size_t)(prev + 10), block) < 0) { rc = -1; break; }
            take = len - done < 20 ? len - done : 20;
            memcpy(out + done, block, take);
            done += take;
            prev = 20;
        }
        EVP_MD_CTX_free(ctx);
        OPENSSL_cleanse(prk, sizeof(prk));
        OPENSSL_cleanse(block, sizeof(block));
        OPENSSL_cleanse(t, sizeof(t));
        return rc;
    }
    /* 1 aes-128-gcm, 2 aes-256-gcm, 3 chacha20-ietf-poly1305 */
    static const EVP_CIPHER *honk_ss_cipher(int id) {
        if (id >= 1 && id <= 3 && honk_fetched_ciphers[id] != NULL) return honk_fetched_ciphers[id];
        switch (id) {
        case 1: return EVP_aes_128_gcm();
        case 2: return EVP_aes_256_gcm();
        case 3: return EVP_chacha20_poly1305();
        default: return NULL;
        }
    }
    /* a context for cipher c with 12-byte nonces, keyed when key is not NULL; NULL on failure */
    static EVP_CIPHER_CTX *honk_aead_ctx(const EVP_CIPHER *c, const uint8_t *key, int enc) {
        EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
        if (ctx == NULL) return NULL;
        if (EVP_CipherInit_ex(ctx, c, NULL, NULL, NULL, enc) != 1
            || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1
            || (key != NULL && EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, enc) != 1)) {
            EVP_CIPHER_CTX_free(ctx);
            return NULL;
        }
        return ctx;
    }
    static inline int honk_aead_key(EVP_CIPHER_CTX *ctx, const uint8_t *key, int enc) {
        return EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, enc) == 1 ? 0 : -1;
    }

    /* VMess chunk masks (option M) are a SHAKE128 stream over the body IV, read two bytes at
       a time. OpenSSL 3.0 cannot keep squeezing an XOF, so the sponge is here: Keccak-f[1600]
       (FIPS 202), lanes addressed byte by byte so it does not depend on the host's byte order. */
    #define HONK_SHAKE128_RATE 168
    static const uint64_t honk_keccak_rc[24] = {
        0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808aULL, 0x8000000080008000ULL,
        0x000000000000808bULL, 0x0000000080000001ULL, 0x8000000080008081ULL, 0x8000000000008009ULL,
        0x000000000000008aULL, 0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000aULL,
        0x000000008000808bULL, 0x800000000000008bULL, 0x8000000000008089ULL, 0x8000000000008003ULL,
        0x8000000000008002ULL, 0x8000000000000080ULL, 0x000000000000800aULL, 0x800000008000000aULL,
        0x8000000080008081ULL, 0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL};
    /* rho offsets and pi destinations along the lane walk that starts at lane 1 */
    static const uint8_t honk_keccak_rho[24] = {
        1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 2, 14, 27, 41, 56, 8, 25, 43, 62, 18, 39, 61, 20, 44};
    static const uint8_t honk_keccak_pi[24] = {
        10, 7, 11, 17, 18, 3, 5, 16, 8, 21, 24, 4, 15, 23, 19, 13, 12, 2, 20, 14, 22, 9, 6, 1};
    static inline uint64_t honk_rotl(uint64_t x, int n) { return (x << n) | (x >> (64 - n)); }
    static void honk_keccak_f(uint64_t *a) {
        uint64_t c[5], t, u;
        for (int round = 0; round < 24; round++) {
            for (int x = 0; x < 5; x++) c[x] = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
            for (int x = 0; x < 5; x++) {
                t = c[(x + 4) % 5] ^ honk_rotl(c[(x + 1) % 5], 1);
                for (int y = 0; y < 25; y += 5) a[y + x] ^= t;
            }
            t = a[1];
            for (int i = 0; i < 24; i++) {
                u = a[honk_keccak_pi[i]];
                a[honk_keccak_pi[i]] = honk_rotl(t, honk_keccak_rho[i]);
                t = u;
            }
            for (int y = 0; y < 25; y += 5) {
                for (int x = 0; x < 5; x++) c[x] = a[y + x];
                for (int x = 0; x < 5; x++) a[y + x] = c[x] ^ (~c[(x + 1) % 5] & c[(x + 2) % 5]);
            }
            a[0] ^= honk_keccak_rc[round];
        }
    }
    static inline uint8_t honk_lane_byte(const uint64_t *a, int i) { return (uint8_t)(a[i >> 3] >> (8 * (i & 7))); }
    static inline void honk_lane_xor(uint64_t *a, int i, uint8_t b) { a[i >> 3] ^= (uint64_t)b << (8 * (i & 7)); }
    /* absorb a short message (less than one rate block) with SHAKE's padding; squeezing starts at *pos = 0 */
    static void honk_shake128_init(uint64_t *a, uint32_t *pos, const uint8_t *msg, int n) {
        memset(a, 0, 25 * sizeof(uint64_t));
        for (int i = 0; i < n; i++) honk_lane_xor(a, i, msg[i]);
        honk_lane_xor(a, n, 0x1F);
        honk_lane_xor(a, HONK_SHAKE128_RATE - 1, 0x80);
        honk_keccak_f(a);
        *pos = 0;
    }
    /* the next two bytes of the stream, big-endian (the rate is even: a pair never straddles blocks) */
    static inline uint16_t honk_shake128_next16(uint64_t *a, uint32_t *pos) {
        if (*pos + 2 > HONK_SHAKE128_RATE) { honk_keccak_f(a); *pos = 0; }
        uint16_t v = (uint16_t)((honk_lane_byte(a, *pos) << 8) | honk_lane_byte(a, *pos + 1));
        *pos += 2;
        return v;
    }
    /* VMess body nonces: a big-endian 16-bit chunk count, then bytes 2..11 of the body IV */
    static inline void honk_vmess_nonce(uint8_t *nonce, uint16_t *count) {
        nonce[0] = (uint8_t)(*count >> 8);
        nonce[1] = (uint8_t)*count;
        (*count)++;
    }
    """
    int honk_seal(EVP_CIPHER_CTX* ctx, uint8_t* nonce, const uint8_t* inp, int n, uint8_t* out) nogil
    int honk_open(EVP_CIPHER_CTX* ctx, uint8_t* nonce, const uint8_t* inp, int n, uint8_t* out) nogil
    int honk_ss_subkey(const uint8_t* master, int len, const uint8_t* salt, uint8_t* out) nogil
    void honk_crypto_init()
    const EVP_CIPHER* honk_ss_cipher(int id) nogil
    EVP_CIPHER_CTX* honk_aead_ctx(const EVP_CIPHER* c, const uint8_t* key, int enc) nogil
    int honk_aead_key(EVP_CIPHER_CTX* ctx, const uint8_t* key, int enc) nogil
    void EVP_CIPHER_CTX_free(EVP_CIPHER_CTX* ctx) nogil
    void OPENSSL_cleanse(void* p, size_t n) nogil
    void honk_shake128_init(uint64_t* a, uint32_t* pos, const uint8_t* msg, int n) nogil
    uint16_t honk_shake128_next16(uint64_t* a, uint32_t* pos) nogil
    void honk_vmess_nonce(uint8_t* nonce, uint16_t* count) nogil



# Shadowsocks AEAD ciphers the engine frames: name -> (key and salt size, honk_ss_cipher id).
_CIPHERS = {"aes-128-gcm": (16, 1), "aes-256-gcm": (32, 2), "chacha20-ietf-poly1305": (32, 3)}
honk_crypto_init()  # before any worker starts


# VMess body securities the engine frames: name -> honk_ss_cipher id (0: none, plain chunks).
_VMESS_SECURITIES = {"aes-128-gcm": 1, "chacha20-poly1305": 3, "none": 0}


cdef bytes _sized(value, int size, str what):
    cdef bytes b = bytes(value)
    if len(b) != size:
        raise ValueError(f"framing: {what} must be {size} bytes")
    return b


cdef Aead* _vmess_new(framing) except NULL:
    """The worker's state for a VMess framing object (``framing.engine_keys()``, see relay_py)."""
    cdef Aead* a
    cdef int cid, key_size
    cdef bytes seal_key, seal_iv, open_key, open_iv, len_key, len_nonce, hdr_key, hdr_nonce
    security, k1, v1, k2, v2, k3, n3, k4, n4, check = framing.engine_keys()
    if security not in _VMESS_SECURITIES:
        raise ValueError("framing: unsupported VMess security")
    cid = _VMESS_SECURITIES[security]
    key_size = 32 if cid == 3 else 16
    seal_iv = _sized(v1, 16, "the request body IV")
    open_iv = _sized(v2, 16, "the response body IV")
    len_key = _sized(k3, 16, "a header key")
    len_nonce = _sized(n3, 12, "a header nonce")
    hdr_key = _sized(k4, 16, "a header key")
    hdr_nonce = _sized(n4, 12, "a header nonce")
    seal_key = _sized(k1, key_size, "the request body key") if cid else b""
    open_key = _sized(k2, key_size, "the response body key") if cid else b""
    a = <Aead*>calloc(1, sizeof(Aead))
    if a == NULL:
        raise MemoryError()
    a.vmess = 1
    a.plen = -1
    a.hlen = -1
    a.check = <uint8_t>(int(check) & 0xFF)
    a.tag = SS_TAG if cid else 0
    memcpy(a.hdr_len_key, PyBytes_AS_STRING(len_key), 16)
    memcpy(a.hdr_len_nonce, PyBytes_AS_STRING(len_nonce), 12)
    memcpy(a.hdr_key, PyBytes_AS_STRING(hdr_key), 16)
    memcpy(a.hdr_nonce, PyBytes_AS_STRING(hdr_nonce), 12)
    memcpy(a.seal_nonce, PyBytes_AS_STRING(seal_iv), 12)  # bytes 0..1 become the chunk count
    memcpy(a.open_nonce, PyBytes_AS_STRING(open_iv), 12)
    honk_shake128_init(a.seal_mask, &a.seal_mask_pos, <const uint8_t*>PyBytes_AS_STRING(seal_iv), 16)
    honk_shake128_init(a.open_mask, &a.open_mask_pos, <const uint8_t*>PyBytes_AS_STRING(open_iv), 16)
    if cid:
        a.cipher = honk_ss_cipher(cid)
        a.sealer = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(seal_key), 1)
        a.opener = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(open_key), 0)
        if a.cipher == NULL or a.sealer == NULL or a.opener == NULL:
            _aead_free(a)
            raise OSError(EIO, "framing: OpenSSL refused the cipher")
    return a


cdef Aead* _aead_new(framing, bytes salt=None) except NULL:
    """The worker's framing state for a framing object (see relay_py's module docstring).

    ``salt``: a Shadowsocks framing whose salt is not sent yet (``hs_connect``): the sealer is
    keyed here from that salt and starts at nonce 0; otherwise the encryptor's subkey and nonce."""
    cdef Aead* a
    cdef bytes master, subkey, nonce
    cdef int key_len, cid
    cdef uint8_t key[32]
    if getattr(framing, "kind", "shadowsocks") == "vmess":
        return _vmess_new(framing)
    spec = _CIPHERS.get(getattr(framing, "cipher", None))
    if spec is None:
        raise ValueError("framing: unsupported cipher")
    key_len, cid = spec
    master = bytes(framing.master)
    if len(master) != key_len:
        raise ValueError("framing: key size does not match the cipher")
    if salt is not None:
        if len(salt) != key_len:
            raise ValueError("framing: salt size does not match the cipher")
        if honk_ss_subkey(<const uint8_t*>PyBytes_AS_STRING(master), key_len,
                          <const uint8_t*>PyBytes_AS_STRING(salt), key) < 0:
            raise OSError(EIO, "framing: OpenSSL refused the key derivation")
        subkey = (<char*>key)[:key_len]
        OPENSSL_cleanse(key, 32)
        counter = 0
    else:
        encryptor = framing.encryptor
        if not getattr(encryptor, "salt_sent", True):
            raise ValueError("framing: the client's salt has not been sent")
        subkey = bytes(encryptor.subkey)
        if len(subkey) != key_len:
            raise ValueError("framing: key size does not match the cipher")
        counter = int(encryptor.nonce)
    if not 0 <= counter < 1 << 96:
        raise ValueError("framing: nonce counter out of range")
    nonce = counter.to_bytes(12, "little")
    a = <Aead*>calloc(1, sizeof(Aead))
    if a == NULL:
        raise MemoryError()
    a.key_len = key_len
    a.plen = -1
    memcpy(a.master, PyBytes_AS_STRING(master), key_len)
    memcpy(a.seal_nonce, PyBytes_AS_STRING(nonce), 12)
    a.cipher = honk_ss_cipher(cid)
    a.sealer = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(subkey), 1)
    a.opener = honk_aead_ctx(a.cipher, NULL, 0)
    if a.cipher == NULL or a.sealer == NULL or a.opener == NULL:
        _aead_free(a)
        raise OSError(EIO, "framing: OpenSSL refused the cipher")
    return a


cdef bytes _unsent_salt(framing):
    """The salt of a Shadowsocks framing that has sent nothing yet, else None: its encryptor's,
    or for a fresh framing (no codec objects made) a new one (``framing.new_salt()``)."""
    if framing is None or getattr(framing, "kind", "shadowsocks") != "shadowsocks":
        return None
    if getattr(framing, "fresh", False):
        return framing.new_salt()
    encryptor = framing.encryptor
    if getattr(encryptor, "salt_sent", True):
        return None
    return bytes(encryptor.salt)


cdef char* _salted_head(Aead* a, bytes salt, bytes head, size_t* n) except NULL:
    """The salt and ``head`` sealed as chunks after it, in a malloc'd buffer of n bytes."""
    cdef size_t k = PyBytes_GET_SIZE(salt)
    cdef size_t plain = PyBytes_GET_SIZE(head)
    cdef ssize_t sealed
    cdef char* out = <char*>malloc(k + plain + (plain + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * SS_OVERHEAD)
    if out == NULL:
        raise MemoryError()
    memcpy(out, PyBytes_AS_STRING(salt), k)
    sealed = _seal_chunks(a, <const uint8_t*>PyBytes_AS_STRING(head), plain, <uint8_t*>out + k)
    if sealed < 0:
        free(out)
        raise OSError(EIO, "framing: OpenSSL refused to seal the header")
    n[0] = k + <size_t>sealed
    return out


cdef void _aead_free(Aead* a) noexcept nogil:
    if a == NULL:
        return
    EVP_CIPHER_CTX_free(a.sealer)
    EVP_CIPHER_CTX_free(a.opener)
    cdef char* pend = a.pend
    OPENSSL_cleanse(a, sizeof(Aead))  # keys, nonces and mask sponges
    free(pend)
    free(a)


cdef int _open_once(const uint8_t* key, const uint8_t* nonce12, const uint8_t* p, int n, uint8_t* out) noexcept nogil:
    """Open one AES-128-GCM seal (n bytes + tag) with its own key and nonce: 0, EBADMSG, or EIO."""
    cdef uint8_t nonce[12]
    cdef int rc
    cdef EVP_CIPHER_CTX* ctx = honk_aead_ctx(honk_ss_cipher(1), key, 0)
    if ctx == NULL:
        return EIO
    memcpy(nonce, nonce12, 12)
    rc = honk_open(ctx, nonce, p, n, out)
    EVP_CIPHER_CTX_free(ctx)
    return EBADMSG if rc < 0 else 0


cdef ssize_t _vmess_chunk(Aead* a, const uint8_t* p, size_t k, uint8_t* out) noexcept nogil:
    """One VMess chunk of k payload bytes into out (k + 2 + tag bytes; k == 0 is the ending chunk); its size or -1."""
    cdef uint16_t size = <uint16_t>(k + a.tag)
    cdef uint16_t masked = size ^ honk_shake128_next16(a.seal_mask, &a.seal_mask_pos)
    cdef uint8_t nonce[12]
    out[0] = <uint8_t>(masked >> 8)
    out[1] = <uint8_t>(masked & 0xFF)
    if a.sealer == NULL:
        memcpy(out + 2, p, k)
    else:
        memcpy(nonce, a.seal_nonce, 12)  # a copy: honk_seal steps it, which must not reach the IV bytes
        honk_vmess_nonce(nonce, &a.seal_count)
        if honk_seal(a.sealer, nonce, p, <int>k, out + 2) < 0:
            return -1
    return <ssize_t>(2 + size)


cdef inline size_t _vmess_overhead(size_t n) noexcept nogil:
    """What sealing n bytes as VMess chunks adds: per chunk of up to SS_MAX_PAYLOAD bytes, a
    2-byte length and a tag."""
    return (n + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * (2 + SS_TAG)


cdef ssize_t _seal_chunks(Aead* a, const uint8_t* p, size_t n, uint8_t* out) noexcept nogil:
    """Seal n plaintext bytes as maximal chunks into out (at most n + SS_OVERHEAD per chunk); bytes written or -1."""
    cdef size_t pos = 0, o = 0, k
    cdef ssize_t w
    cdef uint8_t head[2]
    if a.vmess:
        while pos < n:  # VMess allows longer chunks; the same bound keeps one buffer size for both
            k = n - pos if n - pos < SS_MAX_PAYLOAD else SS_MAX_PAYLOAD
            w = _vmess_chunk(a, p + pos, k, out + o)
            if w < 0:
                return -1
            o += <size_t>w
            pos += k
        return <ssize_t>o
    while pos < n:
        k = n - pos if n - pos < SS_MAX_PAYLOAD else SS_MAX_PAYLOAD
        head[0] = <uint8_t>(k >> 8)
        head[1] = <uint8_t>(k & 0xFF)
        if honk_seal(a.sealer, a.seal_nonce, head, 2, out + o) < 0:
            return -1
        if honk_seal(a.sealer, a.seal_nonce, p + pos, <int>k, out + o + SS_HEAD) < 0:
            return -1
        o += k + SS_OVERHEAD
        pos += k
    return <ssize_t>o



cdef int _framed_start(Engine self, Flow* f, double now) noexcept nogil:
    """A framed flow starts: both directions copy (never splice), the engine's framing buffers
    exist, and the preamble in d[0].buf is replaced by its sealed chunks. 0, or -1 if it ended."""
    cdef Dir* d = &f.d[0]
    cdef char* sealed
    cdef ssize_t n
    if _framed_buffers(self, f, now) < 0:
        return -1
    if d.len == 0:
        return 0
    sealed = <char*>malloc(d.len + (d.len + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * SS_OVERHEAD)
    if sealed == NULL:
        self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
        return -1
    n = _seal_chunks(f.aead, <uint8_t*>d.buf, d.len, <uint8_t*>sealed)
    free(d.buf)
    d.buf = sealed
    d.off = 0
    d.len = d.cap = <size_t>n if n > 0 else 0
    if n < 0:
        self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
        return -1
    return 0


cdef int _framed(Engine self, Flow* f, int di, size_t n, double now) noexcept nogil:
    """Seal (up) or open (down) the n bytes just read into fin + VMESS_WIRE, then send the
    result on to dst. 0, or -1 if the flow ended.

    Up: the plaintext becomes maximal chunks (payload up to 0x3FFF). Down: the bytes kept
    from the last read (an incomplete salt or chunk) are put back just before the new ones,
    every complete chunk is opened, and the incomplete rest is kept again.
    """
    cdef Aead* a = f.aead
    cdef uint8_t* p
    cdef uint8_t* out = <uint8_t*>self.fout
    cdef ssize_t sealed, used
    cdef size_t total, pos = 0, o = 0
    cdef uint8_t head[2]
    cdef uint8_t key[32]
    if n < FRAMED_READ and not f.rdhup[di]:
        f.readable[di] = 0  # a short read drained src
    if di == 0:
        sealed = _seal_chunks(a, <uint8_t*>self.fin + VMESS_WIRE, n, out)
        if sealed < 0:
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        return self._send_rest(f, 0, self.fout, <size_t>sealed, now)
    total = a.pend_len + n
    p = <uint8_t*>self.fin + VMESS_WIRE - a.pend_len
    if a.pend_len:
        memcpy(p, a.pend, a.pend_len)
    if a.vmess:
        used = _vmess_opened(self, f, a, p, total, &o, now)
        if used < 0 or _keep(self, f, a, p + used, total - <size_t>used, VMESS_WIRE, now) < 0:
            return -1
        return self._send_rest(f, 1, self.fout, o, now) if o else 0
    if not a.keyed and total >= a.key_len:
        # the server's salt is in: its subkey opens everything from here on
        if honk_ss_subkey(a.master, a.key_len, p, key) < 0 or honk_aead_key(a.opener, key, 0) < 0:
            OPENSSL_cleanse(key, 32)
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        OPENSSL_cleanse(key, 32)
        a.keyed = 1
        pos = a.key_len
    while a.keyed:
        if a.plen < 0:
            if total - pos < SS_HEAD:
                break
            if honk_open(a.opener, a.open_nonce, p + pos, 2, head) < 0:
                _framing_failed(self, f, EBADMSG, now)
                return -1
            a.plen = (head[0] << 8) | head[1]
            if a.plen > SS_MAX_PAYLOAD:  # SIP004: the two high bits are reserved, zero
                _framing_failed(self, f, EPROTO, now)
                return -1
            pos += SS_HEAD
        if total - pos < <size_t>a.plen + SS_TAG:
            break
        if honk_open(a.opener, a.open_nonce, p + pos, a.plen, out + o) < 0:
            _framing_failed(self, f, EBADMSG, now)
            return -1
        o += <size_t>a.plen
        pos += <size_t>a.plen + SS_TAG
        a.plen = -1
    if _keep(self, f, a, p + pos, total - pos, CHUNK_WIRE, now) < 0:
        return -1
    return self._send_rest(f, 1, self.fout, o, now) if o else 0


cdef int _reserve(Engine self, Flow* f, Dir* d, size_t size, double now) noexcept nogil:
    """Grow d's buffer to at least size bytes: 0, or -1 if the flow ended for want of memory."""
    cdef char* grown
    if d.cap >= size:
        return 0
    grown = <char*>realloc(d.buf, size)
    if grown == NULL:
        self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
        return -1
    d.buf = grown
    d.cap = size
    return 0


cdef int _keep(Engine self, Flow* f, Aead* a, uint8_t* rest, size_t n, size_t cap, double now) noexcept nogil:
    """Keep the incomplete rest of a read (n < cap bytes) in a for the next one. 0, or -1 if
    the flow ended."""
    if n:
        if a.pend == NULL:
            a.pend = <char*>malloc(cap)
            if a.pend == NULL:
                self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                return -1
        memcpy(a.pend, rest, n)
    a.pend_len = <uint32_t>n
    return 0


cdef ssize_t _vmess_opened(Engine self, Flow* f, Aead* a, uint8_t* p, size_t total, size_t* opened,
                           double now) noexcept nogil:
    """Open the VMess response in p[0:total] (kept bytes, then the new ones): its sealed header
    once, then every complete chunk, the plaintext into fout (``opened`` bytes). How many
    bytes of p were used (the incomplete rest is the caller's to keep), or -1 if the flow
    ended."""
    cdef uint8_t* out = <uint8_t*>self.fout
    cdef size_t pos = 0, o = 0
    cdef uint32_t size
    cdef int err
    cdef uint8_t head[2]
    cdef uint8_t header[VMESS_HEADER_MAX]
    cdef uint8_t nonce[12]
    a.got_any = 1
    while not a.keyed:
        if a.hlen < 0:
            if total - pos < SS_HEAD:
                break
            err = _open_once(a.hdr_len_key, a.hdr_len_nonce, p + pos, 2, head)
            if err:
                _framing_failed(self, f, err, now)
                return -1
            a.hlen = (head[0] << 8) | head[1]
            if a.hlen < 4 or a.hlen > VMESS_HEADER_MAX:
                _framing_failed(self, f, EPROTO, now)
                return -1
            pos += SS_HEAD
        if total - pos < <size_t>a.hlen + SS_TAG:
            break
        err = _open_once(a.hdr_key, a.hdr_nonce, p + pos, a.hlen, header)
        if err == 0 and header[0] != a.check:
            err = EBADMSG  # a response to another request
        elif err == 0 and header[2] != 0 and a.hlen < 4 + header[3]:
            err = EPROTO  # a command longer than the header
        if err:
            _framing_failed(self, f, err, now)
            return -1
        pos += <size_t>a.hlen + SS_TAG
        a.keyed = 1
    while a.keyed and not a.ended:
        if a.plen < 0:
            if total - pos < 2:
                break
            size = ((p[pos] << 8) | p[pos + 1]) ^ honk_shake128_next16(a.open_mask, &a.open_mask_pos)
            if size < a.tag:
                _framing_failed(self, f, EPROTO, now)
                return -1
            a.plen = <int32_t>size
            pos += 2
        if total - pos < <size_t>a.plen:
            break
        if a.opener == NULL:
            memcpy(out + o, p + pos, a.plen)
        else:
            memcpy(nonce, a.open_nonce, 12)
            honk_vmess_nonce(nonce, &a.open_count)
            if honk_open(a.opener, nonce, p + pos, a.plen - a.tag, out + o) < 0:
                _framing_failed(self, f, EBADMSG, now)
                return -1
        if a.plen == a.tag:
            a.ended = 1  # the empty chunk: the server's side of the body is over
        o += <size_t>(a.plen - a.tag)
        pos += <size_t>a.plen
        a.plen = -1
    if a.ended and total > pos:
        _framing_failed(self, f, EPROTO, now)  # bytes after the ending chunk
        return -1
    opened[0] = o
    return <ssize_t>pos


cdef int _framed_eof(Engine self, Flow* f, int di, double now) noexcept nogil:
    """EOF on a framed flow's side di: from the upstream, a verdict if its answer was cut
    short (or, for VMess, never began); from the client, VMess's ending chunk is queued.
    0, or -1 if the flow ended."""
    cdef Aead* a = f.aead
    if di == 0:
        return _vmess_end(self, f, now) if a.vmess else 0
    if a.vmess and not a.got_any:
        _framing_failed(self, f, ENOMSG, now)  # the server closed without answering
        return -1
    if a.pend_len or a.plen >= 0 or (a.vmess and not a.keyed):
        _framing_failed(self, f, ENODATA, now)  # EOF inside the salt, header or a chunk: truncated
        return -1
    return 0


cdef int _vmess_end(Engine self, Flow* f, double now) noexcept nogil:
    """The client is done: queue VMess's empty chunk, which goes out before the upstream's FIN.
    0, or -1 if the flow ended."""
    cdef Dir* d = &f.d[0]
    cdef ssize_t w
    if _reserve(self, f, d, SS_HEAD, now) < 0:
        return -1
    w = _vmess_chunk(f.aead, NULL, 0, <uint8_t*>d.buf)
    if w < 0:
        self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
        return -1
    d.off = 0
    d.len = <size_t>w
    return 0


cdef void _framing_failed(Engine self, Flow* f, int err, double now) noexcept nogil:
    """End a framed flow for what its upstream sent, on the upstream side, and count it:
    EBADMSG (a tag did not verify), EPROTO (a length over 0x3FFF), ENODATA (EOF inside
    the salt or a chunk)."""
    if err == EBADMSG:
        honk_store64(&self.n_auth, self.n_auth + 1)
    else:
        honk_store64(&self.n_proto, self.n_proto + 1)
    self._end(f, C_ERROR, (1 << 16) | err, now)


cdef int _framed_buffers(Engine self, Flow* f, double now) noexcept nogil:
    """A framed flow starts: both directions copy (never splice), and the engine's framing
    buffers exist. 0, or -1 if the flow ended for want of memory."""
    f.d[0].copy = 1
    f.d[1].copy = 1
    if self.fin == NULL:
        self.fin = <char*>malloc(FRAMED_BUF)
        self.fout = <char*>malloc(FRAMED_BUF)
        if self.fin == NULL or self.fout == NULL:
            free(self.fin)
            free(self.fout)
            self.fin = self.fout = NULL
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return -1
    return 0

# -- TLS flows (Trojan, VLESS or VMess over TLS) ------------------------------------------
