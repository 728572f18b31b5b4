# C for the compiled build of nodeid_py.py (keep in step with it).
#
# A Python class's __hash__, even a compiled one, is reached through the generic slot: a method
# lookup, a call and an attribute read, about 360 instructions per hash. The compiled build
# points NodeId's tp_hash at a C function that reads the stored hash from its slot directly, and
# its tp_richcompare at one that compares two NodeIds' ``int`` slots (what UUID.__eq__ does, in
# Python, whenever a list or dict meets two equal-hashed or distinct node ids); any other
# comparison goes to the slot it had.

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

    static Py_ssize_t honk_nodeid_int_offset = -1;
    static richcmpfunc honk_nodeid_base_richcompare = NULL;

    static PyObject *honk_nodeid_richcompare(PyObject *self, PyObject *other, int op) {
        if ((op == Py_EQ || op == Py_NE) && Py_TYPE(other) == Py_TYPE(self)) {
            PyObject *a = *(PyObject **)((char *)self + honk_nodeid_int_offset);
            PyObject *b = *(PyObject **)((char *)other + honk_nodeid_int_offset);
            if (a != NULL && b != NULL) {
                int equal = PyObject_RichCompareBool(a, b, Py_EQ);
                if (equal < 0)
                    return NULL;
                return PyBool_FromLong(op == Py_EQ ? equal : !equal);
            }
        }
        return honk_nodeid_base_richcompare(self, other, op);
    }

    static Py_ssize_t honk_slot_offset(PyObject *type, const char *name) {
        Py_ssize_t offset;
        PyObject *descr = PyObject_GetAttrString(type, name);
        if (descr == NULL)
            return -1;
        if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "NodeId.%s is not a slot", name);
            return -1;
        }
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        return offset;
    }

    static int honk_install_nodeid_hash(PyObject *type) {
        PyTypeObject *t = (PyTypeObject *)type;
        honk_nodeid_hash_offset = honk_slot_offset(type, "_hash");
        if (honk_nodeid_hash_offset < 0)
            return -1;
        honk_nodeid_int_offset = honk_slot_offset(type, "int");  /* UUID's own slot */
        if (honk_nodeid_int_offset < 0)
            return -1;
        if (t->tp_richcompare == NULL) {
            PyErr_SetString(PyExc_TypeError, "NodeId has no comparison to keep");
            return -1;
        }
        honk_nodeid_base_richcompare = t->tp_richcompare;
        t->tp_hash = honk_nodeid_hash;
        t->tp_richcompare = honk_nodeid_richcompare;
        PyType_Modified(t);
        return 0;
    }
    """
    int honk_install_nodeid_hash(object type) except -1
