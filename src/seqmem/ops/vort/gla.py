"""VORT's SOE retention on CUDA through a chunked simple-GLA kernel, channels as heads: flash-linear-attention's, or
seqmem's own with the same signature (``chunk_simple_gla.py``).

Each SOE channel s of eqs. (14)-(15) is a scalar-gated linear attention with a data-independent decay:
``G_t^(s) = e^{-ξ_s} G_{t-1}^(s) + (c_s(α_t) φ(k_t)) v_tᵀ``; its key sum ``b^(s)`` is the same recurrence with a value
column of ones.  ``chunk_simple_gla`` computes ``h_t = e^{g_t} h_{t-1} + k_t v_tᵀ``, ``o_t = h_tᵀ q_t·scale``
per head, so with the channels as extra heads (keys ``c_s(α_t) φ(k_t)``, gate ``g = -ξ_s``, values ``[v_t, 1]``,
``scale = 1``) and the per-channel outputs summed, it computes exactly eq. (16)'s numerator and denominator.

Scaled keys (``k_log_scale`` β, FAVOR+): the state is kept in units of e^{m_t}, ``m_t = max(m_{t-1}, β_t)``.
Re-expressing the state in new units multiplies it by ``e^{m_{t-1} - m_t} ≤ 1``, which is one more scalar gate:
``g_t = -ξ_s + m_{t-1} - m_t``, keys ``c_s φ(k_t) e^{β_t - m_t}``.  The running maximum and those factors are computed
here in PyTorch (autograd differentiates them).  ``normalizer="plain"`` adds one channel with ``ξ = 0``, ``c = 1``
and values ``[0, 0, 1]`` for the undecayed key sum ``z``.

Not covered (the op runs its PyTorch form): ``strict_causal=True``, float64, a single token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__: list[str] = []  # reached through soe_retention on CUDA


def _fla_gla() -> Callable:
    from fla.ops.simple_gla import chunk_simple_gla

    return chunk_simple_gla


def soe_retention_gla(
    q: Tensor, k: Tensor, v: Tensor, coef: Tensor, xi: Tensor, coef_now: Tensor, *, eps0: float, normalizer: str,
    initial_state: dict[str, Tensor] | None, k_log_scale: Tensor | None, gla: Callable | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`seqmem.ops.soe_retention` (``strict_causal=False``) as one simple-GLA call with the channels as heads.

    ``coef (B, T, H, S')`` and ``coef_now (B, T, H)`` already expanded by the op.  ``gla``: a function with the
    signature of fla's ``chunk_simple_gla(q, k, v, g, scale=, initial_state=, output_final_state=)`` (None: fla's).
    """
    gla = _fla_gla() if gla is None else gla
    B, T, H, F = q.shape
    Dv, S = v.shape[-1], xi.shape[0]
    st = initial_state or {}
    plain = normalizer == "plain"
    dt = q.dtype
    # 1. key units: m_t = max(m_{t-1}, β_t); the state's rescale e^{m_{t-1} - m_t} is a gate, e^{β_t - m_t} a key factor
    if k_log_scale is not None:
        if "m" in st:  # −inf (a state that has seen no key yet, so all zero) takes the first key's units
            m0 = torch.where(torch.isfinite(st["m"]), st["m"], k_log_scale[:, 0])
        elif initial_state is not None:
            m0 = q.new_zeros(B, H)  # a state without m is in units of 1
        else:
            m0 = k_log_scale[:, 0]  # an empty state takes the first key's units
        m = torch.cummax(torch.cat([m0[:, None], k_log_scale], 1), dim=1).values  # (B, T+1, H)
        shift = m[:, :-1] - m[:, 1:]  # ≤ 0
        kt = k * torch.exp(k_log_scale - m[:, 1:])[..., None]
    else:
        m, shift, kt = None, q.new_zeros(B, T, H), k
    # 2. the channels as heads: gate −ξ_s (+ the rescale), keys c_s φ(k), values [v, 1 (, 0)]; plain: + the z channel
    nS, E = S + int(plain), Dv + 1 + int(plain)
    xi_all = torch.cat([xi, xi.new_zeros(1)]) if plain else xi
    g = shift[..., None] - xi_all.to(dt)  # (B, T, H, nS)
    c_all = torch.cat([coef, coef.new_ones(B, T, H, 1)], -1) if plain else coef
    kk = c_all[..., None] * kt[:, :, :, None, :]  # (B, T, H, nS, F)
    qq = q[:, :, :, None, :].expand(B, T, H, nS, F)
    ones = v.new_ones(B, T, H, 1)
    vv = torch.cat([v, ones] + ([torch.zeros_like(ones)] if plain else []), -1)[:, :, :, None].expand(B, T, H, S, E)
    if plain:  # the z channel's values: [0, 0, 1]
        vv = torch.cat([vv, torch.cat([v.new_zeros(B, T, H, Dv + 1), ones], -1)[:, :, :, None]], 3)
    h0 = None
    if initial_state is not None:
        parts = [torch.cat([st["G"], st["b"][..., None]] + ([st["b"].new_zeros(B, H, S, F, 1)] if plain else []), -1)]
        if plain:
            z = st["z"]
            parts.append(torch.cat([z.new_zeros(B, H, 1, F, Dv + 1), z[:, :, None, :, None]], -1))
        h0 = torch.cat(parts, 2).reshape(B, H * nS, F, E).to(torch.promote_types(dt, torch.float32)).contiguous()

    def heads(x: Tensor) -> Tensor:
        return x.reshape(B, T, H * nS, *x.shape[4:]).contiguous()

    o, hT = gla(heads(qq), heads(kk), heads(vv), heads(g[..., None])[..., 0], scale=1.0, initial_state=h0,
                output_final_state=True)  # fmt: skip
    o = o.view(B, T, H, nS, E).sum(3)
    # 3. eq. (16): the lag-0 lump c_now (φ(q)·φ(k)) v, and the denominator
    qk = (q * kt).sum(-1)
    num = o[..., :Dv] + (coef_now * qk)[..., None] * v
    den = o[..., Dv + 1] if plain else o[..., Dv] + coef_now * qk
    out = num / (den + eps0)[..., None]
    hT = hT.view(B, H, nS, F, E).to(dt)
    state = {"G": hT[:, :, :S, :, :Dv].contiguous(), "b": hT[:, :, :S, :, Dv].contiguous()}
    if plain:
        state["z"] = hT[:, :, S, :, Dv + 1].contiguous()
    if m is not None:
        state["m"] = m[:, -1]
    return out.to(v.dtype), state
