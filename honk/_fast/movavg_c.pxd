# C types for the compiled build of movavg_py.py (keep in step with it).

cimport cython
from libc cimport math

cdef double EMA_ALPHA
cdef long long EMA_WARMUP
cdef Py_ssize_t WEIGHTED_MEAN_SIZE

cdef class HalvingAverage:
    cdef double _value
    cdef long long _count
    cpdef double update(self, double sample)
    cpdef void reset(self)

cpdef double halving_average(object samples) except? -1.0

cdef class Ema:
    cdef double _alpha
    cdef long long _warmup
    cdef double _value
    cdef long long _count
    cpdef double update(self, double sample) except? -1.0
    cpdef void reset(self)

cdef class WeightedMean:
    cdef Py_ssize_t _size
    cdef double[::1] _slots
    cdef Py_ssize_t _head
    cdef Py_ssize_t _len
    cpdef object add(self, double value, double weight=*)
    @cython.locals(i=Py_ssize_t, size=Py_ssize_t, total=double, weight=double)
    cpdef object mean(self)
    cpdef void clear(self)
