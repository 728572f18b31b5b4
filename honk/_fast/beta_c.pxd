# C types for the compiled build of beta_py.py (keep in step with it).
# ``from libc cimport math`` makes the file's math.log/log1p/exp/sqrt/isfinite/isnan C calls.

cimport cython
from libc cimport math

cdef double DEFAULT_PRIOR
cdef double DEFAULT_FAILURE_WEIGHT
cdef double LOG_SQRT_2PI
cdef double STIRLING_MIN
cdef double CF_EPSILON
cdef double CF_TINY
cdef long CF_MAX_TERMS
cdef double QUANTILE_TOLERANCE
cdef long QUANTILE_MAX_STEPS
cdef double MAX_EXP

@cython.locals(r=double, r2=double)
cdef double _stirling_correction(double x) noexcept

@cython.locals(shift=double)
cdef double _log_gamma(double x) noexcept

@cython.locals(p=double, q=double, corr=double)
cdef double _log_beta(double a, double b) noexcept

@cython.locals(apb=double, c=double, d=double, h=double, m=long, m2=double, num=double, delta=double)
cdef double _continued_fraction(double x, double a, double b) noexcept

@cython.locals(front=double)
cdef double _incomplete_beta(double x, double a, double b, double log_beta) noexcept

@cython.locals(tail=double, t=double, y=double, lam=double, ra=double, rb=double, h=double,
               w=double, w2=double, x=double, low=double, high=double, scale=double)
cdef double _initial_guess(double p, double a, double b) noexcept

cdef void _check_shape(double a, double b) except *

cpdef double regularized_incomplete_beta(double x, double a, double b) except? -1.0

cpdef double beta_quantile(double p, double a, double b) except? -1.0

@cython.locals(log_beta=double, x=double, lo=double, hi=double, err=double, log_pdf=double,
               pdf=double, step=double, bend=double, x_new=double, _=long)
cdef double _lower_quantile(double p, double a, double b) noexcept

cdef void _check_evidence(double successes, double failures, double confidence, double prior_a,
                          double prior_b, double failure_weight) except *

cpdef double beta_lower_bound(double successes, double failures, double confidence,
                              double prior_a=*, double prior_b=*, double failure_weight=*) except? -1.0
cpdef double beta_upper_bound(double successes, double failures, double confidence,
                              double prior_a=*, double prior_b=*, double failure_weight=*) except? -1.0
