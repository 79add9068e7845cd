"""VLA, the recurrent reference: Algorithm 1 of the paper, one token at a time.

This is ``mode="recurrent"`` of :func:`seqmem.ops.vla_attention` and :func:`seqmem.ops.vla_paper_delta_rule`.
It shares no casting, state-parsing or feature helper with the chunked form in ``chunk.py``, so the test that
compares the two can catch a bug in either.  Inputs are assumed valid (the public ops check them first).

Tensors are ``(batch, time, heads, dim)``; the state is the dict ``{"S": (B,H,Dv,D), "A": (B,H,D,D),
"z": (B,H,D), "pos": (B,) int64}`` ("A" absent with ``fixed_A``, "z" absent with ``normalizer="none"``).
float16 / bfloat16 inputs are computed in float32 with autocast off; ``o`` is returned in ``v``'s dtype.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__: list[str] = []  # the public entry points are vla_attention / vla_paper_delta_rule (mode="recurrent")


def _compute_setup(tensors: list[Tensor], initial_state: dict[str, Tensor] | None):
    """The compute dtype (float64 if any input or state tensor is, else float32) and a context with autocast off."""
    floats = tensors + [t for t in (initial_state or {}).values() if t.is_floating_point()]
    dt = torch.float64 if any(t.dtype == torch.float64 for t in floats) else torch.float32
    dev = tensors[0].device.type
    off = torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else contextlib.nullcontext()
    return dt, off


def _readout(S: Tensor, qt: Tensor, z: Tensor | None, kf: Tensor, eps: float) -> tuple[Tensor, Tensor | None]:
    """One token's read ``o = S φ(q) / max(φ(q)ᵀ z, ε)`` after ``z ← z + φ(k)`` (``z`` None: ``o = S φ(q)``)."""
    qf = F.elu(qt) + 1.0
    o = torch.einsum("bhij,bhj->bhi", S, qf)
    if z is not None:
        z = z + kf
        o = o / torch.clamp((z * qf).sum(-1), min=eps)[..., None]
    return o, z


def vla_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, w_u: Tensor, *, lam0: float = 0.1, u_scale: float | None = None,
    refresh_period: int | None = 20, refresh_eta: float = 1e-3, eps: float = 1e-4, normalizer: str = "paper",
    normalize_key: bool = True, normalize_alpha: bool = True, fixed_A: bool = False,
    initial_state: dict[str, Tensor] | None = None, return_trace: bool = False,
):
    """Algorithm 1 ("VLAv3 Sequential Forward Pass"), eqs. (8)-(11), step by step."""
    dt, off = _compute_setup([q, k, v, w_u], initial_state)
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    st = initial_state or {}
    eye = torch.eye(D, dtype=dt, device=k.device)
    S = st["S"].to(dt) if "S" in st else torch.zeros(B, H, Dv, D, dtype=dt, device=k.device)
    A = None if fixed_A else (st["A"].to(dt) if "A" in st else (eye / lam0).expand(B, H, D, D))
    use_z = normalizer == "paper"
    z = (st["z"].to(dt) if "z" in st else torch.zeros(B, H, D, dtype=dt, device=k.device)) if use_z else None
    pos = st["pos"].long() if "pos" in st else torch.zeros(B, dtype=torch.long, device=k.device)
    scale = 1.0 / math.sqrt(D) if u_scale is None else float(u_scale)
    period = refresh_period or 0
    outs, trace = [], {n: [] for n in ("S", "A", "alpha_hat", "k_hat", "e", "delta")}
    with off:
        # unbind once: slicing inside the loop would make autograd scatter into a full-size zero tensor per step
        for t, (qt, kt, vt) in enumerate(zip(q.to(dt).unbind(1), k.to(dt).unbind(1), v.to(dt).unbind(1))):
            # 1. φ(k) = ELU(k) + 1, k̂ = φ(k)/‖φ(k)‖                                  (§2.2, lines 8-9)
            kf = F.elu(kt) + 1.0
            kh = kf / kf.norm(dim=-1, keepdim=True).clamp_min(1e-12) if normalize_key else kf
            if fixed_A:
                # 2'. the "A_t = I/λ0 fixed" ablation: α = k̂/λ0
                alpha = kh / lam0
                delta = torch.ones_like(kh[..., 0])
            else:
                # 2. u = L2norm(W_u k) · u_scale                                          (eq. 8, line 10)
                u = F.normalize(torch.einsum("hed,bhd->bhe", w_u.to(dt), kt), dim=-1, eps=1e-12) * scale
                # 3. z_sm = A u                                                           (eq. 9, line 12)
                zs = torch.einsum("bhij,bhj->bhi", A, u)
                # 4. δ = max(1 + uᵀ z_sm, ε)                                               (eq. 9, line 13)
                delta = torch.clamp(1 + (u * zs).sum(-1), min=eps)
                # 5. A ← A − z_sm z_smᵀ / δ   (Sherman–Morrison)                            (eq. 9, line 14)
                A = A - zs[..., :, None] * zs[..., None, :] / delta[..., None, None]
                # 6. A ← A + η I at every refresh_period-th position (1-based, from the sequence start)  (lines 15-16)
                if period:
                    hit = ((pos + t + 1) % period == 0).to(dt)
                    A = A + (refresh_eta * hit)[:, None, None, None] * eye
                # 7. α = A k̂                                                              (eq. 10, line 19)
                alpha = torch.einsum("bhij,bhj->bhi", A, kh)
            # 8. α̂ = α/‖α‖                                                                (eq. 10, line 20)
            ah = alpha / alpha.norm(dim=-1, keepdim=True).clamp_min(1e-12) if normalize_alpha else alpha
            # 9. e = v − S k̂                                                              (eq. 10, line 21)
            e = vt - torch.einsum("bhij,bhj->bhi", S, kh)
            # 10. S ← S + e α̂ᵀ                                                            (eq. 10, line 22)
            S = S + e[..., :, None] * ah[..., None, :]
            # 11. o = S φ(q) / max(φ(q)ᵀ z, ε),  z ← z + φ(k)                             (eq. 11, lines 24-26)
            o, z = _readout(S, qt, z, kf, eps)
            outs.append(o)
            if return_trace:
                for n, x in (("S", S), ("A", A if A is not None else (eye / lam0).expand(B, H, D, D)),
                             ("alpha_hat", ah), ("k_hat", kh), ("e", e), ("delta", delta)):
                    trace[n].append(x)
    state = {"S": S, "pos": pos + T}
    if not fixed_A:
        state["A"] = A.contiguous()
    if use_z:
        state["z"] = z
    o = torch.stack(outs, 1).to(v.dtype)
    if return_trace:
        return o, state, {n: torch.stack(x, 1) for n, x in trace.items()}
    return o, state


def vla_paper_delta_rule_naive(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, eps: float = 1e-4, normalizer: str = "paper",
    initial_state: dict[str, Tensor] | None = None,
):
    """The paper's DeltaNet baseline, eq. (4): ``S_t = β_t S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ``, step by step."""
    dt, off = _compute_setup([q, k, v, beta], initial_state)
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    st = initial_state or {}
    use_z = normalizer == "paper"
    S = st["S"].to(dt) if "S" in st else torch.zeros(B, H, Dv, D, dtype=dt, device=k.device)
    z = (st["z"].to(dt) if "z" in st else torch.zeros(B, H, D, dtype=dt, device=k.device)) if use_z else None
    outs = []
    with off:
        for qt, kt, vt, bt in zip(q.to(dt).unbind(1), k.to(dt).unbind(1), v.to(dt).unbind(1), beta.to(dt).unbind(1)):
            # 1. k̂ = L2norm(ELU(k) + 1)
            kf = F.elu(kt) + 1.0
            kh = kf / kf.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            # 2. e = v − S k̂
            e = vt - torch.einsum("bhij,bhj->bhi", S, kh)
            # 3. S ← β S + e k̂ᵀ                                                          (eq. 4)
            S = bt[..., None, None] * S + e[..., :, None] * kh[..., None, :]
            # 4. o = S φ(q) / max(φ(q)ᵀ z, ε),  z ← z + φ(k)                             (eq. 11)
            o, z = _readout(S, qt, z, kf, eps)
            outs.append(o)
    state = {"S": S}
    if use_z:
        state["z"] = z
    return torch.stack(outs, 1).to(v.dtype), state
