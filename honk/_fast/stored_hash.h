/* The Py_hash_t in a stored hash slot: a Python int that hash() returned, so it fits.
 *
 * The nodeid and valuetype kernels' tp_hash read it on every dict lookup of a key (a Score plan
 * of 50 members makes about 400). PyLong_AsSsize_t costs about 57 instructions; a hash value
 * needs at most three 30-bit digits, read here directly. */
#ifndef HONK_STORED_HASH_H
#define HONK_STORED_HASH_H

#include <Python.h>

static inline Py_hash_t honk_stored_hash(PyObject *stored) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyLong_CheckExact(stored) && PyUnstable_Long_IsCompact((PyLongObject *)stored))
        return (Py_hash_t)PyUnstable_Long_CompactValue((PyLongObject *)stored);
#else
    /* 3.11 and older: ob_size is the signed count of PyLong_SHIFT-bit digits */
    if (PyLong_CheckExact(stored)) {
        Py_ssize_t size = Py_SIZE(stored);
        const digit *d = ((PyLongObject *)stored)->ob_digit;
        Py_uhash_t magnitude;
        switch (size < 0 ? -size : size) {
        case 0:
            return 0;
        case 1:
            magnitude = (Py_uhash_t)d[0];
            break;
        case 2:
            magnitude = ((Py_uhash_t)d[1] << PyLong_SHIFT) | d[0];
            break;
        case 3:
            if (PyLong_SHIFT * 2 + 2 > 63 || d[2] > 1)
                return (Py_hash_t)PyLong_AsSsize_t(stored);
            magnitude = ((Py_uhash_t)d[2] << (2 * PyLong_SHIFT)) | ((Py_uhash_t)d[1] << PyLong_SHIFT) | d[0];
            break;
        default:
            return (Py_hash_t)PyLong_AsSsize_t(stored);
        }
        return size < 0 ? -(Py_hash_t)magnitude : (Py_hash_t)magnitude;
    }
#endif
    return (Py_hash_t)PyLong_AsSsize_t(stored);
}

#endif
