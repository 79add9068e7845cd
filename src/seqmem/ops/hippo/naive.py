"""HiPPO-LegS compression, the recurrent reference: the ZOH recurrence of Eq. 4, one token at a time.

This is ``mode="recurrent"`` of :func:`seqmem.ops.hippo_compress`.  It shares no Legendre table, quadrature or
closed form with ``chunk.py``: each token's ``Ā_k`` and ``B̄_k`` are the defining projection integrals, evaluated
here by Gauss–Legendre quadrature of numpy's Legendre polynomials (exact: the integrands are polynomials of
degree < 2N), so the test that compares the modes can catch a bug in either.  Inputs are assumed valid (the
public op checks them first).  Equation numbers are those of the Elastic Memory paper (see
:mod:`seqmem.ops.hippo`).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.polynomial.legendre import leggauss, legvander
from torch import Tensor

__all__: list[str] = []  # the public entry point is hippo_compress(mode="recurrent")


def hippo_compress_naive(signal: Tensor, N: int, c: Tensor, t0: int) -> Tensor:
    """``signal`` (batch, time, channels), token ``s`` held on ``[t0+s, t0+s+1)``; ``c`` (batch, N, channels) the
    coefficients of the history on ``[0, t0]`` (zeros when ``t0 = 0``).  Returns the coefficients after the last
    token."""
    u, w = leggauss(N + 1)  # nodes / weights on [−1, 1]: exact for polynomials of degree <= 2N + 1
    norm = np.sqrt(2.0 * np.arange(N) + 1.0)

    def g(x: np.ndarray, t: float) -> np.ndarray:  # g_n^(t)(x) = √(2n+1) P_n(2x/t − 1), shape (len(x), N)  (Eq. 2)
        return legvander(2.0 * x / t - 1.0, N - 1) * norm

    for s in range(signal.shape[1]):
        k = t0 + s  # tokens before this one; the history grows from [0, k] to [0, k + 1]
        # 1. Ā_k[n, m] = 1/(k+1) ∫_0^k g_n^(k+1)(x) g_m^(k)(x) dx: the history Σ_m c_m g_m^(k) on [0, k],
        #    projected onto the basis of [0, k + 1]  (= (k/(k+1))^A, the ZOH transition)          (Eqs. 2, 4, 22)
        if k == 0:
            Abar = np.zeros((N, N))
        else:
            x = k * (u + 1.0) / 2.0  # nodes on [0, k]
            Abar = (k / 2.0) / (k + 1) * g(x, k + 1).T @ (w[:, None] * g(x, k))
        # 2. B̄_k[n] = 1/(k+1) ∫_k^{k+1} g_n^(k+1)(x) dx: the new token's cell  (= A⁻¹(I − Ā_k)B)      (Eqs. 2, 4, 25)
        x = k + (u + 1.0) / 2.0  # nodes on [k, k + 1]
        Bbar = 0.5 / (k + 1) * g(x, k + 1).T @ w
        # 3. c_{k+1} = Ā_k c_k + B̄_k f_k                                                                  (Eq. 4)
        A_t = torch.tensor(Abar, dtype=signal.dtype, device=signal.device)
        B_t = torch.tensor(Bbar, dtype=signal.dtype, device=signal.device)
        c = A_t @ c + B_t[None, :, None] * signal[:, s, None, :]
    return c
