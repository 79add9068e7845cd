"""HiPPO-LegS compression of 1-D signals (Elastic Memory: *Towards Compressive and Scalable
Recurrent Memory*, Song et al., Section 2 and Appendix E).

Every channel of a signal ``f`` (one value per token, held constant on the token's cell ``[s, s+1)``) is
summarised after ``t`` tokens by ``N`` Legendre coefficients

c_n(t) = (1/t) ∫_0^t f(x) g_n^(t)(x) dx,      g_n^(t)(x) = √(2n+1) P_n(2x/t − 1)          (Eqs. 1–2, 12)

— the L2 projection of the step-function history onto polynomials of degree < N under the uniform measure on
``[0, t]``.  The coefficients obey ``dc/dt = −A c / t + B f / t`` (Eq. 3) with the LegS matrices of Eq. 19;
the ZOH discretisation with one time unit per token (Eqs. 4, 22, 25) is exact for step input, so the ZOH state
after ``t`` tokens *is* that projection.  The block update ``C_i = P_i C_{i−1} + K̄_i F_i`` (Eq. 6) uses

* ``P_i = (iL / (i+1)L)^A = (i/(i+1))^A`` (telescoping product of the ZOH transitions), computed by
  Gauss–Legendre quadrature of the basis-change integral (``legs_transition``);
* ``K̄_i[n, j] = (Q_n(z_{s+1}) − Q_n(z_s)) / (2√(2n+1))`` with ``s = iL + j``, ``z_s = 2s/T − 1``, ``T =
  (i+1)L``, ``Q_0 = z``, ``Q_n = P_{n+1} − P_{n−1}`` (exact integral of the basis over the token cell,
  ``legs_input_kernel``).

Everything is evaluated in float64 with the stable three-term Legendre recurrence — **never** by an
eigendecomposition of ``A`` (which is catastrophically ill-conditioned: error ~1e17 already at N = 64) — and
may be cast to float32 for storage (``legs_block_bank``).  Retrieval evaluates the Legendre expansion at
sample points (Eqs. 7–8, 29–31; ``legs_reconstruction_matrix``, ``hippo_reconstruct``).

Files: ``naive.py`` is the per-token ZOH recurrence (``hippo_compress(mode="recurrent")``, the reference, with
its own quadrature of the projection integrals); ``chunk.py`` the closed forms and the block (``"chunk"``) and
one-matmul (``"direct"``) forms.  ``seqmem.ops.hippo.compress`` / ``reconstruct`` are aliases of
:func:`hippo_compress` / :func:`hippo_reconstruct`.
"""

from seqmem.ops.hippo import chunk as _chunk
from seqmem.ops.hippo.chunk import *  # noqa: F403  (the public functions: every name in chunk.__all__)
from seqmem.ops.hippo.chunk import SAMPLINGS, hippo_compress, hippo_reconstruct  # noqa: F401  (SAMPLINGS: the elastic mixer's)

__all__ = list(_chunk.__all__)

compress = hippo_compress
reconstruct = hippo_reconstruct
