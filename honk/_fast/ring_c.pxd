# C types for the compiled build of ring_py.py (keep in step with it).

cimport cython
from libc cimport math

cdef Py_ssize_t URLTEST_LATENCY_CAPACITY
cdef Py_ssize_t PROBE_HISTORY_CAPACITY
cdef double SYNTHETIC_PLACEHOLDER

cdef class LatencyRing:
    cdef Py_ssize_t _capacity
    cdef double[::1] _at
    cdef double[::1] _values
    cdef signed char[::1] _synthetic
    cdef Py_ssize_t _head
    cdef Py_ssize_t _len
    cdef double _sum
    cdef double _real_sum
    cdef Py_ssize_t _real_len
    cdef Py_ssize_t _last_real

    @cython.locals(slot=Py_ssize_t, old=double)
    cpdef void push(self, double at, double value, bint synthetic=*) except *
    @cython.locals(slot=Py_ssize_t)
    cpdef object last(self)
    @cython.locals(slot=Py_ssize_t)
    cpdef object last_real_sample(self)
    cpdef object average(self)
    cpdef object real_average(self)
    @cython.locals(slot=Py_ssize_t, out=list)
    cpdef list snapshot(self)
    @cython.locals(start=Py_ssize_t, i=Py_ssize_t, entries=list)
    cpdef void restore(self, object items) except *
    cpdef void clear(self)
    @cython.locals(slot=Py_ssize_t, total=double, real=double)
    cdef void _resum(self)
