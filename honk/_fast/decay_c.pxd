# C types for the compiled build of decay_py.py (keep in step with it).

cimport cython
from libc cimport math

cdef double EVIDENCE_HALF_LIFE
cdef double DEMAND_HALF_LIFE
cdef double TRIAL_OUTCOME_HALF_LIFE
cdef double LN2

cdef double _check_half_life(double half_life) except? -1.0
cdef void _check_time(double now) except *

cdef class DecayedCounter:
    cdef double _rate
    cdef double _half_life
    cdef double _value
    cdef double _at
    cpdef double add(self, double amount, double now) except? -1.0
    cpdef double value(self, double now)
    cpdef void clear(self)

cdef class DecayedMean:
    cdef double _rate
    cdef double _half_life
    cdef double _mean
    cdef double _weight
    cdef double _at
    @cython.locals(total=double)
    cpdef object add(self, double value, double weight, double now)
    cpdef object mean(self, double now)
    cpdef double weight(self, double now)
    cpdef double total(self, double now)
    cpdef void clear(self)
