# C types for the compiled build of rank_py.py (keep in step with it).

cimport cython
from honk._fast.cell_c cimport EvidenceCell, blend, qualified

cdef Py_ssize_t EXACT_LAYER
cdef Py_ssize_t _MAX_BANDS

cdef class Candidate:
    cdef public object member
    cdef public Py_ssize_t index
    cdef public double reliability
    cdef public object utility
    cdef readonly bint rated
    cdef readonly double utility_value
    cdef public bint qualified
    cdef public bint unresolved
    cdef public bint recent_failure
    cdef public bint node_failure
    cdef public object episodes
    cdef public object last_failure
    cdef public object backoff
    cdef public bint cleared

@cython.locals(c=Candidate)
cdef Candidate _candidate(object member, Py_ssize_t index, double reliability, object utility, bint qualified)

@cython.locals(out=list, node=object)
cpdef object aligned(list nodes, dict row)

@cython.locals(out=list, node=object, entry=object, i=object, j=Py_ssize_t)
cpdef object placed(dict row, dict position, list aliases, Py_ssize_t count)

@cython.locals(out=list, position=Py_ssize_t, index=object, any_open=bint, c=Candidate, glob=EvidenceCell,
               family=EvidenceCell, exact=EvidenceCell)
cpdef list candidates(list alive, object utilities, list globs, list families, list exacts,
                      list glob_opens, list family_opens, list exact_opens, double now, double recent_window)

@cython.locals(episodes=list, recent=bint, cleared=bint, layer=Py_ssize_t, episode=object, cell=EvidenceCell,
               failed=double)
cdef void _open_episodes(Candidate c, object glob_episode, object family_episode, object exact_episode,
                         EvidenceCell glob, EvidenceCell family, EvidenceCell exact, double now,
                         double recent_window) except *

@cython.locals(steps=double)
cdef Py_ssize_t _band_of(double reliability, double floor, double band) noexcept

@cython.locals(a_band=Py_ssize_t, b_band=Py_ssize_t)
cdef bint _precedes(Candidate a, Candidate b, double floor, double band) except -1

@cython.locals(best=double, i=Py_ssize_t, c=Candidate)
cdef double _floor(list candidates, double band) except? -1.0

@cython.locals(floor=double, c=Candidate, first=Candidate, second=Candidate)
cpdef tuple leaders(list candidates, double band)

@cython.locals(floor=double, c=Candidate, best=Candidate)
cpdef object first_sound(list candidates, double band, object skip)

@cython.locals(count=Py_ssize_t, floor=double, i=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t,
               mid=Py_ssize_t, c=Candidate, out=list)
cpdef list order(list candidates, double band)

@cython.locals(alive=list, nodes=list, dead=Py_ssize_t, index=Py_ssize_t, excluding=bint)
cpdef tuple live(object members, object exclude)

@cython.locals(eligible=list, unresolved=list, c=Candidate)
cpdef tuple survey(list candidates)

@cython.locals(c=Candidate)
cpdef object first_cold(list eligible, object tried)

@cython.locals(c=Candidate)
cpdef object find(list candidates, object node)

@cython.locals(c=Candidate, open_nodes=set)
cpdef void forget_resolved(dict held, object ranked, list unresolved) except *

@cython.locals(out=list, c=Candidate)
cpdef tuple members_first(list order, Candidate winner)

@cython.locals(position=dict, aliases=list, i=Py_ssize_t, j=Py_ssize_t)
cpdef tuple positions(list nodes)

@cython.locals(count=Py_ssize_t, best=double, k=Py_ssize_t, value=double)
cpdef tuple scope_best(list nodes, list values, dict position, bint higher)

@cython.locals(k=Py_ssize_t, value=double, relative=double, gain=double)
cpdef void scope_add(list nodes, list values, list confidences, dict position, bint higher, double best,
                     double weight, double latency_floor, list gains) except *

@cython.locals(gains=list, total=double, entry=tuple, higher=bint, nodes=list, values=list, count=Py_ssize_t,
               best=double, weight=double, i=Py_ssize_t, j=Py_ssize_t)
cpdef object scope_utilities(list scopes, dict position, list aliases, list base_gains, double base_weight,
                             double latency_floor, Py_ssize_t comparable_min)

@cython.locals(out=list)
cpdef list normalized(list gains, double total)
