# C for the compiled build of nodeid_py.py (keep in step with it).
#
# A Python class's __hash__, even a compiled one, is reached through the generic slot: a method
# lookup, a call and an attribute read, about 360 instructions per hash. The compiled build
# points NodeId's tp_hash at a C function that reads the stored hash from its slot directly.

cdef extern from "stored_hash.h":
    pass

cdef extern from *:
    """
    #include "structmember.h"  /* PyMemberDef (Python 3.11) */

    static Py_ssize_t honk_nodeid_hash_offset = -1;

    static Py_hash_t honk_nodeid_hash(PyObject *self) {
        PyObject *stored = *(PyObject **)((char *)self + honk_nodeid_hash_offset);
        if (stored == NULL) {  /* made by __new__ alone: no identity yet */
            PyErr_SetString(PyExc_TypeError, "NodeId has no value");
            return -1;
        }
        return honk_stored_hash(stored);  /* a hash() value always fits */
    }

    static int honk_install_nodeid_hash(PyObject *type) {
        PyObject *descr = PyObject_GetAttrString(type, "_hash");
        if (descr == NULL)
            return -1;
        if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
            Py_DECREF(descr);
            PyErr_SetString(PyExc_TypeError, "NodeId._hash is not a slot");
            return -1;
        }
        honk_nodeid_hash_offset = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        ((PyTypeObject *)type)->tp_hash = honk_nodeid_hash;
        PyType_Modified((PyTypeObject *)type);
        return 0;
    }
    """
    int honk_install_nodeid_hash(object type) except -1
