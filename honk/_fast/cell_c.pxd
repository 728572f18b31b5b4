# C types for the compiled build of cell_py.py (keep in step with it).

cimport cython
from honk._fast.beta_c cimport beta_lower_bound
from honk._fast.decay_c cimport DecayedCounter

cdef object _SUCCESS
cdef object _USEFUL
cdef object _FAILURE
cdef object _SETUP_FAILURE
cdef double QUALIFYING_COMPLETIONS
cdef double BLEND_FULL_EVIDENCE
cdef double SETUP_FAILURE_WEIGHT
cdef double RELIABILITY_CONFIDENCE
cdef double RELIABILITY_PRIOR
cdef double BOUND_REUSE

cdef class EvidenceCell:
    cdef public object incarnation
    cdef public object key
    cdef public DecayedCounter attempts
    cdef public DecayedCounter successes
    cdef public DecayedCounter failures
    cdef public DecayedCounter setup_failures
    cdef public DecayedCounter useful
    cdef public object last_failure
    cdef public object lease_until
    # readonly, with _refresh cpdef: the twin's read_cells can read a compiled cell too
    cdef readonly bint _read
    cdef readonly double _read_at
    cdef readonly double _bound
    cdef readonly double _weight
    cdef readonly double _useful
    cpdef void record(self, object outcome, double now) except *
    cpdef double outcomes(self, double now)
    @cython.locals(failures=double)
    cpdef double bound(self, double now) except? -1.0
    cpdef double weight(self, double now)
    cpdef void _refresh(self, double now) except *

cpdef double reliability_bound(EvidenceCell cell, double now) except? -1.0
cpdef double layer_weight(EvidenceCell cell, double now)

@cython.locals(estimate=double)
cpdef double blend(EvidenceCell glob, EvidenceCell family, EvidenceCell exact, double now) except? -1.0
cpdef bint qualified(EvidenceCell glob, EvidenceCell family, EvidenceCell exact, double now) except -1
cpdef tuple read_cells(tuple cells, double now)
