"""HiPPO-LegS ops (Elastic Memory paper §2 / App. E): closed forms vs expm, recurrence vs projection."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import scipy.linalg as sl
import torch

from conftest import assert_rel_close
from seqmem.ops import hippo
from seqmem.ops.hippo import chunk as hippo_chunk
from seqmem.ops.hippo import (
    hippo_compress,
    hippo_reconstruct,
    legs_block,
    legs_block_bank,
    legs_input_kernel,
    legs_matrices,
    legs_reconstruction_matrix,
    legs_transition,
    sample_fractions,
)
from seqmem.ops.hippo import naive as hippo_naive


def _expm_transition(N: int, t1: float, t2: float) -> np.ndarray:
    A = legs_matrices(N)[0].numpy()
    return sl.expm(-A * np.log(t2 / t1))


def test_legs_matrices_eq19():
    A, B = legs_matrices(7)
    assert torch.equal(A, A.tril())
    assert torch.allclose(torch.diagonal(A), torch.arange(1.0, 8.0, dtype=torch.float64))
    assert A[3, 1] == pytest.approx(np.sqrt(7) * np.sqrt(3))
    assert torch.allclose(B, torch.sqrt(2 * torch.arange(7.0, dtype=torch.float64) + 1))
    e0 = torch.linalg.solve_triangular(A, B[:, None], upper=False)[:, 0]  # A^{-1} B = e_0
    assert torch.allclose(e0, torch.eye(7, dtype=torch.float64)[0], atol=1e-13)
    assert B.shape == (7,)  # Eq. 3's "B in R^{NxN}" is a typo


@pytest.mark.parametrize("N", [16, 64, 256])
def test_transition_closed_form_vs_expm(N):
    for t1, t2 in [(1, 2), (3, 4), (8, 16), (7, 13), (2048, 4096)]:
        P = legs_transition(N, t1, t2).numpy()
        E = _expm_transition(N, t1, t2)
        assert np.abs(P - E).max() <= 1e-10, (N, t1, t2)


@pytest.mark.slow
def test_transition_closed_form_vs_expm_n2160():
    P = legs_transition(2160, 1, 2).numpy()
    assert np.abs(P - _expm_transition(2160, 1, 2)).max() <= 1e-10


def test_transition_is_telescoping_product_and_independent_of_block_len():
    N, L, i = 12, 5, 3
    prod = torch.eye(N, dtype=torch.float64)
    for k in range(i * L, (i + 1) * L):
        prod = legs_transition(N, k, k + 1) @ prod
    P, _ = legs_block(N, L, i)
    assert_rel_close(P, prod, 1e-12, "prod of per-token ZOH transitions")
    assert_rel_close(legs_block(N, 64, i)[0], P, 1e-13, "P_i = (i/(i+1))^A for any L")
    assert torch.count_nonzero(legs_block(N, L, 0)[0]) == 0  # P_0 = 0


def test_transition_norm_is_sqrt_ratio():
    for i in range(1, 7):
        P = legs_block(64, 16, i)[0]
        assert torch.linalg.matrix_norm(P, 2).item() == pytest.approx(np.sqrt(i / (i + 1)), rel=1e-9)


def test_input_kernel_cf3_equals_cf2():
    N = 24
    A, B = (z.numpy() for z in legs_matrices(N))
    T = 20
    K = legs_input_kernel(N, 0, T, T).numpy()
    for s in range(T):
        hi = np.eye(N) if s + 1 == T else _expm_transition(N, s + 1, T)
        lo = np.zeros((N, N)) if s == 0 else _expm_transition(N, s, T)
        cf2 = np.linalg.solve(A, (hi - lo) @ B)
        assert np.abs(K[:, s] - cf2).max() <= 1e-11, s
    assert np.allclose(K[0], 1 / T)  # row 0: running mean


def test_zoh_state_is_exact_projection_of_step_function():
    """T2: the ZOH recurrence equals (1/T)∫ f g_n by per-cell Gauss quadrature (independent of CF3)."""
    N, T = 16, 40
    g = torch.Generator().manual_seed(0)
    f = torch.randn(T, 2, generator=g, dtype=torch.float64)
    c = hippo_compress(f, N, mode="recurrent")[0]
    u, w = np.polynomial.legendre.leggauss(24)
    proj = np.zeros((N, 2))
    for s in range(T):
        x = s + (u + 1) / 2  # nodes in [s, s+1]
        z = 2 * x / T - 1
        gn = np.stack([np.sqrt(2 * n + 1) * np.polynomial.legendre.Legendre.basis(n)(z) for n in range(N)])
        proj += (gn @ (w / 2))[:, None] * f[s].numpy()[None, :] / T
    assert np.abs(c.numpy() - proj).max() <= 1e-12


def test_compress_modes_agree_and_continue():
    N = 20
    x = torch.randn(3, 53, 4, dtype=torch.float64)
    ref = hippo_compress(x, N, mode="direct")
    assert_rel_close(hippo_compress(x, N, mode="recurrent"), ref, 1e-12, "recurrent vs direct")
    for L in (1, 7, 16, 53, 100):
        assert_rel_close(hippo_compress(x, N, block_len=L), ref, 1e-12, f"chunk L={L} vs direct")
    c1 = hippo_compress(x[:, :20], N, block_len=8)
    for mode in ("chunk", "direct", "recurrent"):
        st = {"c": c1, "t": torch.full((3,), 20)}
        c2 = hippo_compress(x[:, 20:], N, mode=mode, block_len=8, initial_state=st)
        assert_rel_close(c2, ref, 1e-12, f"continued ({mode})")


def test_constant_maps_to_e0():
    for mode in ("recurrent", "chunk", "direct"):
        c = hippo_compress(torch.full((2, 37, 1), 2.5, dtype=torch.float64), 12, mode=mode, block_len=8)
        expect = torch.zeros(12, dtype=torch.float64)
        expect[0] = 2.5
        assert (c[0, :, 0] - expect).abs().max() <= 1e-12, mode


def test_float32_bank_drift_n540():
    N, L, nb = 540, 512, 4
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, nb * L, 8, generator=g, dtype=torch.float64)
    ref = hippo_compress(x, N, mode="direct")
    P, K = legs_block_bank(N, L, nb)  # float32 storage
    assert P.dtype == torch.float32 and P.shape == (nb, N, N) and K.shape == (nb, N, L)
    c = torch.zeros(1, N, 8)
    xf = x.float()
    for i in range(nb):
        c = P[i] @ c + K[i] @ xf[:, i * L : (i + 1) * L]
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-6, err


def test_never_eigendecomposes():
    src = "\n".join(inspect.getsource(mod) for mod in (hippo, hippo_chunk, hippo_naive))
    code = "\n".join(ln for ln in src.split("\n") if not ln.strip().startswith(("#", "``", "*")))
    for bad in ("linalg.eig", "np.linalg.eig", ".eig(", "eigh(", "expm("):
        assert bad not in code


def _sines(n_waves: int, T: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = (np.arange(T) + 0.5) / T
    f = np.zeros(T)
    for _ in range(n_waves):
        f += rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * rng.uniform(1, 5) * t + rng.uniform(0, 2 * np.pi))
    return f


def _recon_mse(f: np.ndarray, N: int, points: str) -> float:
    T = f.size
    c = hippo_compress(torch.tensor(f)[:, None], N, block_len=256)
    if points == "midpoint":
        xs = torch.arange(T, dtype=torch.float64) + 0.5
        target = f
    else:  # the paper's uniform left endpoints x_j = j t / L_mem with L_mem = T
        xs = torch.arange(T, dtype=torch.float64)
        target = f
    rec = hippo_reconstruct(c, float(T), xs)[0, :, 0].numpy()
    return float(np.mean((rec - target) ** 2))


def test_reconstruction_table12_smooth_and_noise():
    T = 1024
    mse1 = np.mean([_recon_mse(_sines(1, T, s), 32, "uniform") for s in range(4)])
    mse5 = np.mean([_recon_mse(_sines(5, T, s), 32, "uniform") for s in range(4)])
    assert mse1 < 1e-3 and mse5 < 1e-2 and mse1 < mse5
    assert np.mean([_recon_mse(_sines(5, T, s), 32, "midpoint") for s in range(4)]) < 1e-6
    rng = np.random.default_rng(0)
    for N in (32, 128, 512):
        # expected white-noise MSE at midpoints: mean_s ||(W - I)[s]||^2, W = R K (exact smoothing filter)
        K = legs_input_kernel(N, 0, T, T).numpy()
        W = legs_reconstruction_matrix(N, (np.arange(T) + 0.5) / T).numpy() @ K
        expected = np.mean(np.sum((W - np.eye(T)) ** 2, 1))
        assert abs(expected - (1 - N / T)) < (0.01 if N < 512 else 0.06), (N, expected)  # ~ 1 - N/L
        mse = np.mean([_recon_mse(rng.standard_normal(T), N, "midpoint") for _ in range(6)])
        assert abs(mse - expected) < 0.05, (N, mse, expected)


def test_reconstruction_error_monotone_in_n():
    """T9 / Table 13: L2 error of nested projections (Parseval: ||f||^2 - sum c_n^2) never grows with N."""
    rng = np.random.default_rng(3)
    f = np.cumsum(rng.standard_normal(600)) / 10 + rng.standard_normal(600)
    fx = torch.tensor(f)[:, None]
    errs = []
    for N in (8, 16, 32, 64, 128, 256):
        c = hippo_compress(fx, N, mode="direct")[0, :, 0].numpy()
        errs.append(np.mean(f**2) - np.sum(c**2))
    assert all(a >= b - 1e-12 for a, b in zip(errs, errs[1:])) and errs[-1] < errs[0]


def test_sample_fractions_and_recon_matrix():
    u = sample_fractions("uniform", 5)
    assert np.allclose(u, [0, 0.2, 0.4, 0.6, 0.8])
    e = sample_fractions("exponential", 50, eps=1e-2)
    assert e[-1] == 0.0 and e[0] == pytest.approx(1 - 1e-2) and np.all(np.diff(e) < 0)
    e2 = sample_fractions("exponential", 4, alpha=0.5)
    assert np.allclose(e2, [1 - 0.125, 0.75, 0.5, 0.0])
    R = legs_reconstruction_matrix(6, [0.0, 1.0])
    assert torch.allclose(R[1], torch.sqrt(2 * torch.arange(6.0, dtype=torch.float64) + 1))  # P_n(1) = 1
    assert torch.allclose(R[0], R[1] * torch.tensor([1.0, -1, 1, -1, 1, -1], dtype=torch.float64))
    c = torch.zeros(1, 6, 1, dtype=torch.float64)
    c[0, 0] = 3.0
    const = torch.full((1, 7, 1), 3.0, dtype=torch.float64)
    assert torch.allclose(hippo_reconstruct(c, 10.0, "exponential", 7), const)
    assert hippo.compress is hippo_compress and hippo.reconstruct is hippo_reconstruct


def test_bad_input_raises():
    with pytest.raises(ValueError):
        legs_matrices(0)
    with pytest.raises(ValueError):
        legs_transition(4, 5, 3)
    with pytest.raises(ValueError):
        legs_input_kernel(4, 3, 5, 6)
    with pytest.raises(ValueError):
        legs_block(4, 0, 1)
    with pytest.raises(ValueError):
        sample_fractions("gaussian", 4)
    with pytest.raises(ValueError):
        sample_fractions("exponential", 4, alpha=1.5)
    with pytest.raises(ValueError):
        legs_reconstruction_matrix(4, [0.5, 1.2])
    with pytest.raises(ValueError):
        hippo_compress(torch.zeros(2, 3, 4, 5), 4)
    with pytest.raises(ValueError):
        hippo_compress(torch.zeros(5), 4, mode="fft")
    with pytest.raises(ValueError):
        hippo_reconstruct(torch.zeros(1, 4, 1), 10.0, "uniform")
    with pytest.raises(ValueError):
        hippo_reconstruct(torch.zeros(1, 4, 1), -1.0, "uniform", 3)
