"""VORT retention, the recurrent reference: eqs. (14)–(16) in the merged form, one token at a time.

This is ``mode="recurrent"`` of :func:`seqmem.ops.soe_retention`.  It shares no state-parsing or scaling helper
with the chunked form in ``chunk.py``, so the test that compares the two can catch a bug in either.  Inputs are
assumed valid (the public op checks them first).

Tensors are ``(batch, time, heads, ·)``.  Keys may come in scaled form (FAVOR+ features of large inputs overflow
or underflow): φ(k_t) = k_t·e^{β_t} with ``k_log_scale`` β.  The state is then kept relative to the running maximum
m_t = max_{i≤t} β_i (state key ``"m"``): G̃_t = e^{−m_t} G_t, b̃_t = e^{−m_t} b_t, and o_t = φ(q_t)·G̃_t /
(φ(q_t)·b̃_t + ε0), i.e. ε0 regularises the stabilised denominator (FAVOR+'s max-subtraction), so it never swamps
the read-out when the raw features are tiny.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []  # the public entry point is soe_retention(mode="recurrent")


def soe_retention_naive(
    q: Tensor, k: Tensor, v: Tensor, coef: Tensor, xi: Tensor, coef_now: Tensor | None, *, eps0: float,
    normalizer: str, strict_causal: bool, initial_state: dict[str, Tensor] | None,
    k_log_scale: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loop of eqs. (14)–(16) (merged channels; eq. 13's undecayed denominator with ``"plain"``)."""
    B, T, H, F = q.shape
    Dv = v.shape[-1]
    S = xi.shape[0]
    scaled = k_log_scale is not None
    st = initial_state or {}
    G = st["G"] if "G" in st else q.new_zeros(B, H, S, F, Dv)
    b = st["b"] if "b" in st else q.new_zeros(B, H, S, F)
    z = (st["z"] if "z" in st else q.new_zeros(B, H, F)) if normalizer == "plain" else None
    m = st.get("m") if scaled else None  # (B, H): the state is in units of e^{m}; absent = units of 1
    if scaled and m is None and initial_state is not None:
        m = q.new_zeros(B, H)
    lam = torch.exp(-xi)  # λ_s = e^{−ξ_s}
    outs = []
    for t in range(T):
        qt, kt, vt = q[:, t], k[:, t], v[:, t]  # (B, H, F|Dv)
        ct = coef[:, t] if coef.dim() == 4 else coef[:, t, None, :].expand(B, H, S)  # (B, H, S)
        cn = torch.zeros_like(qt[..., 0]) if coef_now is None else (
            coef_now[:, t] if coef_now.dim() == 3 else coef_now[:, t, None].expand(B, H))
        # 1. decay every channel: G ← λ_s G, b ← λ_s b                                      (eqs. 14–15)
        G = lam[:, None, None] * G
        b = lam[:, None] * b
        if scaled:
            beta_t = k_log_scale[:, t]
            # running key scale m_t = max(m_{t−1}, β_t): the units of the state (and of ε0)
            m_old = beta_t if m is None else m
            m_new = torch.maximum(m_old, beta_t)
        if strict_causal:
            # 2. eq. (13)'s i < t: read out before writing token t (the state is in units of e^{m_old})
            num = torch.einsum("bhf,bhsfd->bhd", qt, G)
            den = torch.einsum("bhf,bhf->bh", qt, z) if z is not None else torch.einsum("bhf,bhsf->bh", qt, b)
            outs.append(num / (den + eps0)[..., None])
        if scaled:
            # 3. re-express the state in units of e^{m_new} (factor ≤ 1) and key t likewise
            r = torch.exp(m_old - m_new)
            G, b = r[..., None, None, None] * G, r[..., None, None] * b
            z = None if z is None else r[..., None] * z
            kt = kt * torch.exp(beta_t - m_new)[..., None]
            m = m_new
        # 4. write: G += c_s(α_t) φ(k_t) v_tᵀ (eq. 14), b += c_s(α_t) φ(k_t) (eq. 15), z += φ(k_t) (eq. 13)
        G = G + ct[..., None, None] * kt[:, :, None, :, None] * vt[:, :, None, None, :]
        b = b + ct[..., None] * kt[:, :, None, :]
        if z is not None:
            z = z + kt
        if not strict_causal:
            # 5. read out, eq. (16): o_t = (φ(q_t)·Σ_s G + c_now φ(q_t)·φ(k_t) v_t) / (φ(q_t)·Σ_s b + c_now … + ε0)
            qk = (qt * kt).sum(-1)
            num = torch.einsum("bhf,bhsfd->bhd", qt, G) + (cn * qk)[..., None] * vt
            den = torch.einsum("bhf,bhf->bh", qt, z) if z is not None else (
                torch.einsum("bhf,bhsf->bh", qt, b) + cn * qk)
            outs.append(num / (den + eps0)[..., None])
    state = {"G": G, "b": b}
    if z is not None:
        state["z"] = z
    if scaled:
        state["m"] = m
    return torch.stack(outs, 1), state
