# C for the compiled build of valuetype_py.py (keep in step with it).
#
# A Python __hash__ returning a stored slot costs about 360 instructions per call (method lookup,
# frame, attribute read), and a Python __eq__ more. install() points the class's tp_hash at a C
# function reading the stored hash and its tp_richcompare at one comparing every slot with
# PyObject_RichCompareBool (which takes identical objects as equal at once), the hash first.

cdef extern from "stored_hash.h":
    pass

cdef extern from *:
    """
    #include "structmember.h"  /* PyMemberDef, PyMemberDescrObject (Python 3.11) */

    #define HONK_VALUE_SLOTS_MAX 15

    typedef struct {
        PyTypeObject *type;
        Py_ssize_t hash_offset;
        Py_ssize_t count;  /* slots compared, the hash first */
        Py_ssize_t offsets[HONK_VALUE_SLOTS_MAX + 1];
    } honk_value_type;

    /* Installed types, oldest first (honk's own keys are installed at import, so found first).
       Each holds a reference to its type: a freed type's address is never matched again. */
    static honk_value_type *honk_value_types = NULL;
    static Py_ssize_t honk_value_type_count = 0;
    static Py_ssize_t honk_value_type_room = 0;

    static honk_value_type *honk_exact_value_type(PyTypeObject *type) {
        for (Py_ssize_t i = 0; i < honk_value_type_count; i++)
            if (honk_value_types[i].type == type)
                return &honk_value_types[i];
        return NULL;
    }

    /* The installed type itself, or else its nearest installed base: a subclass made later
       inherits these slots, and its base's slots lie at the same offsets. */
    static honk_value_type *honk_value_type_of(PyTypeObject *type) {
        for (; type != NULL; type = type->tp_base) {
            honk_value_type *vt = honk_exact_value_type(type);
            if (vt != NULL)
                return vt;
        }
        return NULL;
    }

    static Py_hash_t honk_value_hash(PyObject *self) {
        honk_value_type *vt = honk_value_type_of(Py_TYPE(self));
        PyObject *stored;
        if (vt == NULL) {  /* cannot happen: only installed types (and subclasses) have this slot */
            PyErr_SetString(PyExc_TypeError, "value type not installed");
            return -1;
        }
        stored = *(PyObject **)((char *)self + vt->hash_offset);
        if (stored == NULL) {  /* made by __new__ alone: no value yet */
            PyErr_Format(PyExc_TypeError, "%s has no value", Py_TYPE(self)->tp_name);
            return -1;
        }
        return honk_stored_hash(stored);  /* a hash() value always fits */
    }

    static PyObject *honk_value_richcompare(PyObject *self, PyObject *other, int op) {
        honk_value_type *vt;
        Py_ssize_t i;
        if ((op != Py_EQ && op != Py_NE) || Py_TYPE(other) != Py_TYPE(self))
            Py_RETURN_NOTIMPLEMENTED;
        if (self == other)
            return PyBool_FromLong(op == Py_EQ);
        vt = honk_value_type_of(Py_TYPE(self));
        if (vt == NULL)
            Py_RETURN_NOTIMPLEMENTED;
        for (i = 0; i < vt->count; i++) {
            PyObject *a = *(PyObject **)((char *)self + vt->offsets[i]);
            PyObject *b = *(PyObject **)((char *)other + vt->offsets[i]);
            int equal;
            if (a == NULL || b == NULL) {
                PyErr_Format(PyExc_AttributeError, "%s has an unset slot", Py_TYPE(self)->tp_name);
                return NULL;
            }
            equal = PyObject_RichCompareBool(a, b, Py_EQ);
            if (equal < 0)
                return NULL;
            if (!equal)
                return PyBool_FromLong(op == Py_NE);
        }
        return PyBool_FromLong(op == Py_EQ);
    }

    /* Every object slot of ``type`` and its bases (member descriptors of T_OBJECT_EX), the one
       named _hash first; fails on anything else a plain slots class would not have. */
    static int honk_install_value_type(PyObject *type_obj) {
        PyTypeObject *type = (PyTypeObject *)type_obj;
        honk_value_type vt;
        PyObject *mro = type->tp_mro;
        Py_ssize_t i, j;
        if (honk_exact_value_type(type) != NULL)
            return 0;
        if (type->tp_dictoffset != 0) {
            PyErr_Format(PyExc_TypeError, "%s has a __dict__: its state is not only slots", type->tp_name);
            return -1;
        }
        vt.type = type;
        vt.hash_offset = -1;
        vt.count = 1;  /* offsets[0] is the hash */
        for (i = 0; i < PyTuple_GET_SIZE(mro); i++) {
            PyObject *dict = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
            PyObject *name, *value;
            Py_ssize_t pos = 0;
            if (PyTuple_GET_ITEM(mro, i) == (PyObject *)&PyBaseObject_Type)
                continue;
            while (PyDict_Next(dict, &pos, &name, &value)) {
                PyMemberDef *member;
                if (!PyObject_TypeCheck(value, &PyMemberDescr_Type))
                    continue;
                member = ((PyMemberDescrObject *)value)->d_member;
                if (member->type != T_OBJECT_EX)
                    continue;  /* __weakref__ and the like are not part of the value */
                if (PyUnicode_CompareWithASCIIString(name, "_hash") == 0) {
                    vt.hash_offset = member->offset;
                    continue;
                }
                for (j = 1; j < vt.count; j++)
                    if (vt.offsets[j] == member->offset)
                        break;
                if (j < vt.count)
                    continue;  /* the same slot seen again through a subclass */
                if (vt.count > HONK_VALUE_SLOTS_MAX) {
                    PyErr_Format(PyExc_TypeError, "%s has too many slots", type->tp_name);
                    return -1;
                }
                vt.offsets[vt.count++] = member->offset;
            }
        }
        if (vt.hash_offset < 0) {
            PyErr_Format(PyExc_TypeError, "%s has no _hash slot", type->tp_name);
            return -1;
        }
        vt.offsets[0] = vt.hash_offset;
        if (honk_value_type_count == honk_value_type_room) {
            Py_ssize_t room = honk_value_type_room ? 2 * honk_value_type_room : 8;
            honk_value_type *grown = PyMem_Realloc(honk_value_types, room * sizeof(honk_value_type));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            honk_value_types = grown;
            honk_value_type_room = room;
        }
        Py_INCREF(type_obj);
        honk_value_types[honk_value_type_count++] = vt;
        type->tp_hash = honk_value_hash;
        type->tp_richcompare = honk_value_richcompare;
        PyType_Modified(type);
        return 0;
    }
    """
    int honk_install_value_type(object type) except -1
