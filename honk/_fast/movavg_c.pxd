# C types for the compiled build of movavg_py.py (keep in step with it).

cdef class HalvingAverage:
    cdef double _value
    cdef long long _count
    cpdef double update(self, double sample)
    cpdef void reset(self)

cpdef double halving_average(object samples) except? -1.0
