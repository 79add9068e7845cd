"""HiPPO-LegS, the closed forms (float64, three-term Legendre recurrence, Gauss–Legendre quadrature of the
basis change) and the block / direct forms of :func:`hippo_compress`; ``mode="recurrent"`` runs the per-token
reference in ``naive.py``.  The model and the formulas are described in :mod:`seqmem.ops.hippo`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import OrderedDict

import numpy as np
import torch
from numpy.polynomial.legendre import leggauss
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import cached_constants, check_choice, check_same_device, check_state_keys
from seqmem.ops.hippo.naive import hippo_compress_naive

__all__ = [
    "legs_matrices",
    "legs_transition",
    "legs_input_kernel",
    "legs_block",
    "legs_block_bank",
    "legs_blocks",
    "clear_legs_blocks",
    "sample_fractions",
    "legs_reconstruction_matrix",
    "hippo_compress",
    "hippo_reconstruct",
]

SAMPLINGS = ("uniform", "exponential", "midpoint")


def _check_n(N: int) -> int:
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N <= 0:
        raise ValueError(f"HiPPO order N must be a positive integer, got {N!r}")
    return int(N)


def _legendre_table(nmax: int, z: np.ndarray) -> np.ndarray:
    """Rows P_0..P_nmax evaluated at points ``z`` (float64), by the three-term recurrence (stable on [−1,
    1])."""
    z = np.asarray(z, dtype=np.float64)
    P = np.zeros((nmax + 1, z.size))
    P[0] = 1.0
    if nmax >= 1:
        P[1] = z
    for n in range(1, nmax):
        P[n + 1] = ((2 * n + 1) * z * P[n] - n * P[n - 1]) / (n + 1)
    return P


def legs_matrices(N: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
                  ) -> tuple[Tensor, Tensor]:
    """HiPPO-LegS ``(A, B)`` of Eq. 19: ``A[n,k] = √(2n+1)√(2k+1)`` (n > k), ``n+1`` (n = k), 0 (n < k);
    ``B[n] = √(2n+1)``.

    ``B`` is an N-vector (Eq. 3's "B ∈ R^{N×N}" is a typo).  ``A`` is lower triangular with eigenvalues 1..N
    and
    ``A^{-1} B = e_0`` (column 0 of A equals B), so a constant signal maps to a multiple of ``e_0``.
    """
    N = _check_n(N)
    q = np.sqrt(2.0 * np.arange(N) + 1.0)
    A = np.tril(np.outer(q, q), -1) + np.diag(np.arange(1.0, N + 1.0))
    return torch.tensor(A, dtype=dtype, device=device), torch.tensor(q, dtype=dtype, device=device)


@functools.lru_cache(maxsize=8)
def _gauss(M: int) -> tuple[np.ndarray, np.ndarray]:
    u, w = leggauss(M)  # Gauss–Legendre nodes and weights on [-1, 1] (numpy only: no scipy at run time)
    return u, w


_CACHE_MAX_FLOATS = 1 << 22  # results larger than this (32 MiB in float64) are not memoised


def _transition_np(N: int, t1: float, t2: float) -> np.ndarray:
    if N * N <= _CACHE_MAX_FLOATS:
        return _transition_cached(N, t1, t2)
    return _transition_impl(N, t1, t2)


@functools.lru_cache(maxsize=128)
def _transition_cached(N: int, t1: float, t2: float) -> np.ndarray:
    return _transition_impl(N, t1, t2)


def _transition_impl(N: int, t1: float, t2: float) -> np.ndarray:
    r = t1 / t2
    if r == 0.0:
        return np.zeros((N, N))
    if r == 1.0:
        return np.eye(N)
    u, w = _gauss(N + 1)  # exact: the integrand has degree <= 2N - 2
    q = np.sqrt(2.0 * np.arange(N) + 1.0)
    G1 = _legendre_table(N - 1, r * (u + 1.0) - 1.0) * q[:, None]
    G2 = _legendre_table(N - 1, u) * q[:, None]
    P = (r / 2.0) * G1 @ (w[:, None] * G2.T)
    return np.tril(P)  # exactly lower triangular (the upper part is quadrature round-off)


def legs_transition(N: int, t1: float, t2: float, dtype: torch.dtype = torch.float64,
                    device: torch.device | str | None = None) -> Tensor:
    """``(t1/t2)^A``: maps the LegS coefficients of a history on ``[0, t1]`` to those on ``[0, t2]`` (no new
    input).

    Closed form (docs/elastic.md): ``P[n,k] = (r/2)√((2n+1)(2k+1)) Σ_q w_q P_n(r(u_q+1) − 1) P_k(u_q)``, ``r =
    t1/t2``,
    with N+1 Gauss–Legendre nodes (exact).  ``P_i = legs_transition(N, iL, (i+1)L) = (i/(i+1))^A`` and
    ``‖P‖₂ = √(t1/t2)``.  ``t1 = 0`` gives the zero matrix.
    """
    N = _check_n(N)
    if not (0 <= t1 <= t2) or t2 <= 0:
        raise ValueError(f"legs_transition needs 0 <= t1 <= t2 and t2 > 0, got t1={t1}, t2={t2}")
    return torch.tensor(_transition_np(N, float(t1), float(t2)), dtype=dtype, device=device)


def _kernel_np(N: int, s0: int, length: int, T: int) -> np.ndarray:
    if N * length <= _CACHE_MAX_FLOATS:
        return _kernel_cached(N, s0, length, T)
    return _kernel_impl(N, s0, length, T)


@functools.lru_cache(maxsize=128)
def _kernel_cached(N: int, s0: int, length: int, T: int) -> np.ndarray:
    return _kernel_impl(N, s0, length, T)


def _kernel_impl(N: int, s0: int, length: int, T: int) -> np.ndarray:
    z = 2.0 * np.arange(s0, s0 + length + 1, dtype=np.float64) / T - 1.0
    P = _legendre_table(N, z)  # P_0..P_N
    Q = np.empty((N, z.size))
    Q[0] = z
    if N > 1:
        Q[1:] = P[2 : N + 1] - P[0 : N - 1]
    return (Q[:, 1:] - Q[:, :-1]) / (2.0 * np.sqrt(2.0 * np.arange(N) + 1.0))[:, None]


def legs_input_kernel(N: int, s0: int, length: int, T: int, dtype: torch.dtype = torch.float64,
                      device: torch.device | str | None = None) -> Tensor:
    """(N, length) matrix mapping tokens ``s0 .. s0+length−1`` to their contribution to the state at time
    ``T``.

    Column j is ``(1/T) ∫_{s}^{s+1} g_n^(T)(x) dx`` with ``s = s0 + j`` (docs/elastic.md); it equals the paper's
    HiPPO
    kernel column ``A^{-1}[((s+1)/T)^A − (s/T)^A] B`` (Eq. 27, CF2).  Needs ``s0 + length <= T``.  Row 0 is
    1/T.
    """
    N = _check_n(N)
    for nm, v in (("s0", s0), ("length", length), ("T", T)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"legs_input_kernel: {nm} must be a non-negative integer, got {v!r}")
    if T <= 0 or s0 + length > T:
        raise ValueError(
            f"legs_input_kernel needs s0 + length <= T and T > 0, got s0={s0}, length={length}, T={T}"
        )
    return torch.tensor(_kernel_np(N, int(s0), int(length), int(T)), dtype=dtype, device=device)


def legs_block(N: int, block_len: int, i: int, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(P_i, K̄_i)`` of Eq. 6 for 0-indexed block ``i`` of ``block_len`` tokens (one time unit per token).

    ``P_i = (i/(i+1))^A`` (N×N, ``P_0 = 0``), ``K̄_i`` (N×block_len) the input kernel of tokens
    ``iL .. (i+1)L − 1`` at time ``(i+1)L``.  Computed in float64, returned in ``dtype`` on ``device``.
    """
    N = _check_n(N)
    check_int("block_len", block_len)
    check_int("block index", i, 0)
    P = legs_transition(N, i * block_len, (i + 1) * block_len, dtype, device)
    K = legs_input_kernel(N, i * block_len, block_len, (i + 1) * block_len, dtype, device)
    return P, K


#: :func:`legs_blocks`' kept matrices: per (N, block_len, dtype, device) the blocks last read, least recently used
#: first, and how many that configuration keeps
_BLOCKS: dict[tuple, tuple[OrderedDict, list[int]]] = {}
#: the fewest blocks a configuration keeps (a call over more blocks raises its own configuration's count to that)
BLOCKS_KEPT_MIN = 64


def legs_blocks(N: int, block_len: int, first: int, count: int, dtype: torch.dtype,
                device: torch.device | str | None = None) -> list[tuple[Tensor, Tensor]]:
    """:func:`legs_block` of blocks ``first .. first + count − 1`` in ``dtype`` on ``device``, kept across calls.

    Each block's closed forms cost O(N³ + N²·block_len) float64 work on the host (≈ 0.1 s at the paper's N = 540,
    L = 2,048): they are computed once and kept, shared by every caller with the same ``(N, block_len, dtype,
    device)``.  A configuration keeps its most recently read blocks: at least :data:`BLOCKS_KEPT_MIN`, and as
    many as the largest ``count`` asked of it, so a call over more blocks than were kept does not evict its own
    blocks and recompute every one on the next call.  That is ``4·N·(N + block_len)`` bytes per block in float32
    (5.6 MB at N = 540, L = 2,048), kept for the life of the process, after the models that read them (one
    evaluation over 489 blocks, 1M tokens at the paper's sizes, keeps 2.7 GB): :func:`clear_legs_blocks` frees
    them.  Built with autograd and inference mode off (plain constants a later backward may save).  While
    ``torch.compile`` traces, blocks already kept are only read and none is evicted.
    """
    check_int("count", count, 0)
    check_int("first block index", first, 0)
    check_int("block_len", block_len)
    key = (_check_n(N), int(block_len), dtype, torch.device(device) if device is not None else torch.device("cpu"))
    bank, kept = _BLOCKS.setdefault(key, (OrderedDict(), [BLOCKS_KEPT_MIN]))
    kept[0] = max(kept[0], count)
    tracing = torch.compiler.is_compiling()

    def build(i: int) -> tuple[Tensor, Tensor]:
        P, K = legs_block(N, block_len, i, device=key[3])
        return P.to(dtype), K.to(dtype)

    out = []
    for i in range(first, first + count):
        if i in bank and not tracing:
            bank.move_to_end(i)
        out.append(cached_constants(bank, i, functools.partial(build, i)))
    while not tracing and len(bank) > kept[0]:  # never while traced: a compiled forward's blocks stay
        bank.popitem(last=False)
    return out


def clear_legs_blocks() -> None:
    """Free every block :func:`legs_blocks` keeps (they are recomputed when next read; a model compiled after
    ``Elastic.prepare_compile`` then rebuilds them inside its traced forward, with graph breaks, until
    ``prepare_compile`` is called again)."""
    _BLOCKS.clear()


def legs_block_bank(
    N: int, block_len: int, n_blocks: int, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Stacked bank ``(P (n_blocks, N, N), K̄ (n_blocks, N, block_len))``: float64 math, ``dtype`` storage."""
    check_int("n_blocks", n_blocks)
    Ps, Ks = zip(*(legs_block(N, block_len, i) for i in range(n_blocks)))
    return torch.stack(Ps).to(dtype), torch.stack(Ks).to(dtype)


def sample_fractions(kind: str, num: int, alpha: float | None = None, eps: float = 1e-3) -> np.ndarray:
    """Sample points ``x_j / t`` in [0, 1] for retrieval (Appendix E.4).

    * ``"uniform"``: ``x_j = j t / num`` (left endpoints, as the paper writes it; includes x = 0);
    * ``"exponential"``: ``x_j = t (1 − α^{num−1−j})``, dense near the present; ``α`` defaults to
      ``eps^{1/(num−1)}`` so that the newest point is ``eps·t`` before the present (``num = 1``: the single point
      is x = 0, the oldest, as the formula gives for any α);
    * ``"midpoint"``: ``x_j = (j + ½) t / num`` (cell centres; our variant).
    """
    check_choice(None, "sampling", kind, SAMPLINGS)
    num = _check_n(num)
    j = np.arange(num, dtype=np.float64)
    if kind == "uniform":
        return j / num
    if kind == "midpoint":
        return (j + 0.5) / num
    if alpha is None:
        if not (0.0 < eps < 1.0):
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        alpha = eps ** (1.0 / (num - 1)) if num > 1 else 0.5
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return 1.0 - alpha ** (num - 1 - j)


def legs_reconstruction_matrix(N: int, fractions, dtype: torch.dtype = torch.float64,
                               device: torch.device | str | None = None) -> Tensor:
    """``R[j, n] = √(2n+1) P_n(2 x_j/t − 1)`` (Eq. 7), shape (len(fractions), N), for fractions ``x_j/t`` in
    [0, 1].

    The same matrix serves every block: ``x_j / t`` does not depend on ``t`` for either sampling rule.
    """
    N = _check_n(N)
    fr = np.asarray(fractions, dtype=np.float64).reshape(-1)
    if fr.size == 0 or not np.all(np.isfinite(fr)) or fr.min() < 0 or fr.max() > 1:
        raise ValueError("sample fractions must be a non-empty array of values in [0, 1]")
    R = _legendre_table(N - 1, 2.0 * fr - 1.0) * np.sqrt(2.0 * np.arange(N) + 1.0)[:, None]
    return torch.tensor(R.T.copy(), dtype=dtype, device=device)


def _batched(name: str, x: Tensor) -> Tensor:
    """A floating-point ``x`` as (batch, ·, channels): (n,) -> (1, n, 1), (n, c) -> (1, n, c); else unchanged."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor")
    return x[None, :, None] if x.dim() == 1 else x[None] if x.dim() == 2 else x


def _check_signal(signal: Tensor) -> Tensor:
    signal = _batched("hippo_compress: signal", signal)
    if signal.dim() != 3:
        raise ValueError(
            "hippo_compress: signal must have shape (time,), (time, channels) or (batch, time, channels), "
            f"got {tuple(signal.shape)}"
        )
    return signal


def hippo_compress(
    signal: Tensor,
    N: int,
    *,
    mode: str = "chunk",
    block_len: int | None = None,
    initial_state: dict[str, Tensor] | Tensor | None = None,
    t0: int | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    """LegS coefficients (batch, N, channels) of the step-function history after all of ``signal``.

    ``signal``: (batch, time, channels) (or (time,) / (time, channels)), token ``s`` held on ``[t0+s, t0+s+1)``
    with ``t0`` the tokens before it; ``initial_state``: the state a previous call with ``return_state=True``
    returned (None: the history starts here, ``t0 = 0``):

    * ``"c"``: (batch, N, channels) the coefficients of the history on ``[0, t0]`` (read as zero when t0 = 0);
    * ``"t"``: (batch,) int64 the tokens seen so far, ``t0``, equal across the batch.

    Returns the coefficients ``c``, or with ``return_state=True`` the pair ``(c, {"c": c, "t": t0 + time})``.
    The state is opt-in rather than always returned: every existing caller takes the coefficients themselves
    (which *are* the compressed history), and a pair by default would break them; the dict adds only the position
    the continuation needs.  The former form, a bare coefficient tensor as ``initial_state`` and/or the position as
    ``t0``, is read as ``{"c": tensor, "t": t0}`` with a DeprecationWarning (``t0`` alone: a zero history of ``t0``
    tokens).  A bare tensor with no ``t0`` is refused: it does not say how many tokens it summarises (it was
    formerly ignored, so a continuation from it silently restarted the history).  Modes:

    * ``"recurrent"``: the per-token ZOH recurrence ``c_k = Ā_k c_{k−1} + B̄_k f_k`` (Eq. 4) with
      ``Ā_k = (k/(k+1))^A``, ``B̄_k = A^{-1}(I − Ā_k)B`` (the reference, ``naive.py``);
    * ``"chunk"``: blocks of ``block_len`` tokens counted from time 0, ``C ← P C + K̄ F`` (Eq. 6);
    * ``"direct"``: ``C(T) = (t0/T)^A C(t0) + K̄^{[t0, T)} F`` in one matmul (docs/elastic.md).
    """
    signal = _check_signal(signal)
    N = _check_n(N)
    if mode not in ("recurrent", "chunk", "direct"):
        raise ValueError(f"hippo_compress: mode must be 'recurrent', 'chunk' or 'direct', got {mode!r}")
    b, t, ch = signal.shape
    c, t0 = _compress_start(initial_state, t0, b, N, ch, signal.device)
    if c is not None and c.dtype != signal.dtype:  # mixed floating dtypes: computed in their promoted dtype
        dt = torch.promote_types(c.dtype, signal.dtype)
        signal, c = signal.to(dt), c.to(dt)
    dt, dev = signal.dtype, signal.device
    if c is None:
        c = signal.new_zeros(b, N, ch)
    if t == 0:  # an empty piece: the coefficients unchanged
        pass
    elif mode == "direct":
        P = legs_transition(N, t0, t0 + t, dt).to(dev)
        K = legs_input_kernel(N, t0, t, t0 + t, dt).to(dev)
        c = P @ c + K @ signal
    elif mode == "recurrent":
        c = hippo_compress_naive(signal, N, c, t0)
    else:
        L = block_len if block_len is not None else max(1, min(t + t0, 1024))
        if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
            raise ValueError(f"hippo_compress: block_len must be a positive integer, got {block_len!r}")
        s = 0
        while s < t:
            pos = t0 + s
            end = min((pos // L + 1) * L, t0 + t)  # next block boundary (blocks counted from time 0)
            P = legs_transition(N, pos, end, dt).to(dev)
            K = legs_input_kernel(N, pos, end - pos, end, dt).to(dev)
            c = P @ c + K @ signal[:, s : s + end - pos]
            s += end - pos
    if not return_state:
        return c
    return c, {"c": c, "t": torch.full((b,), t0 + t, dtype=torch.long, device=dev)}


def _compress_start(initial_state, t0, b: int, N: int, ch: int, device: torch.device) -> tuple[Tensor | None, int]:
    """``(c, t0)`` where :func:`hippo_compress` starts: ``c`` None for an empty history (zero coefficients).  The
    state's tensors must be on the signal's ``device`` (checked before the position is read)."""
    op = "hippo_compress"
    if isinstance(initial_state, dict):
        tensors = {f"initial_state[{key!r}]": v for key, v in initial_state.items() if isinstance(v, Tensor)}
        check_same_device(op, signal=torch.empty(0, device=device), **tensors)
    elif isinstance(initial_state, Tensor):
        check_same_device(op, signal=torch.empty(0, device=device), initial_state=initial_state)
    if t0 is None and isinstance(initial_state, Tensor):
        # a bare tensor says nothing of the tokens it summarises: read at t0 = 0 it was dropped (the history
        # restarted), so a continuation from it was silently the output of the new tokens alone
        raise ValueError(f"{op}: a bare coefficient tensor as initial_state needs the tokens it summarises; pass "
                         "the state dict {'c': coefficients, 't': tokens seen (batch,) int64} (the form "
                         "return_state=True returns), or (deprecated) t0=<tokens seen>; got a tensor of shape "
                         f"{tuple(initial_state.shape)} and no t0")
    if t0 is not None or isinstance(initial_state, Tensor):  # the former form
        if isinstance(initial_state, dict):
            raise ValueError(f"{op}: give the position in initial_state['t'], not as t0")
        if t0 is not None and (isinstance(t0, bool) or not isinstance(t0, int) or t0 < 0):
            raise ValueError(f"{op}: t0 must be a non-negative integer, got {t0!r}")
        warnings.warn(f"{op}: a tensor initial_state and t0 are deprecated; pass the state dict "
                      "{'c': coefficients, 't': tokens seen (batch,) int64} (the form return_state=True returns)",
                      DeprecationWarning, stacklevel=3)
        c, t0 = initial_state, t0 or 0
    elif initial_state is None:
        return None, 0
    else:
        check_state_keys(op, initial_state, ("c", "t"))
        c, pos = initial_state["c"], initial_state["t"]
        if not isinstance(pos, Tensor) or pos.shape != (b,) or pos.is_floating_point() or pos.is_complex():
            raise ValueError(f"{op}: initial_state['t'] must be an integer tensor of shape {(b,)}, got "
                             f"{pos!r}")
        t0 = int(pos[0])
        if t0 < 0 or bool((pos != t0).any()):
            raise ValueError(f"{op}: initial_state['t'] must be one non-negative position for the whole batch, "
                             f"got {pos.tolist()}")
    if c is not None and not isinstance(c, Tensor):
        raise ValueError(f"{op}: initial_state['c'] must be a tensor, got {type(c).__name__}")
    if c is None or (t0 == 0 and c.dim() == 3):
        return None, t0
    if c.shape != (b, N, ch):
        raise ValueError(f"{op}: initial_state['c'] must have shape (batch, N, channels) = {(b, N, ch)}, got "
                         f"{tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__}")
    if not c.is_floating_point():
        raise ValueError(f"{op}: initial_state['c'] must be a floating-point tensor, got dtype {c.dtype}")
    return c, t0


def hippo_reconstruct(
    coeffs: Tensor,
    t: float,
    points: Tensor | np.ndarray | str,
    num: int | None = None,
    *,
    alpha: float | None = None,
    eps: float = 1e-3,
) -> Tensor:
    """Evaluate the Legendre expansion ``ĝ(x) = Σ_n c_n √(2n+1) P_n(2x/t − 1)`` (Eq. 29) at sample points.

    ``coeffs``: (batch, N, channels) (or (N,) / (N, channels)); ``t``: history length; ``points``: absolute
    positions in [0, t] (tensor/array) or a sampling rule ``"uniform" | "exponential" | "midpoint"`` with
    ``num``
    points (see :func:`sample_fractions`).  Returns (batch, n_points, channels).
    """
    coeffs = _batched("coeffs", coeffs)
    if coeffs.dim() != 3:
        raise ValueError(f"coeffs must have shape (batch, N, channels), got {tuple(coeffs.shape)}")
    if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
        raise ValueError(f"t must be a positive number, got {t!r}")
    N = coeffs.shape[1]
    if isinstance(points, str):
        if num is None:
            raise ValueError("num (number of points) is required with a named sampling rule")
        fr = sample_fractions(points, num, alpha=alpha, eps=eps)
    else:
        x = (
            points.detach().cpu().double().numpy()
            if isinstance(points, Tensor)
            else np.asarray(points, float)
        )
        fr = x / t
    R = legs_reconstruction_matrix(N, fr, coeffs.dtype, coeffs.device)
    return R @ coeffs

