"""Check a kernel or a layer of your own (or fla's) against seqmem's reference forms.

:func:`assert_matches_reference` compares, on random inputs from a fixed seed: the outputs, the final states,
the gradients of every input (and of the final state's sum), and *split-sequence continuation* — the sequence run
in two calls, the second starting from the first's final state, must equal one call over the whole sequence (the
check that catches a chunked kernel whose state handoff is wrong even when its one-shot output is right).

* **An op in flash-linear-attention's convention** (``fn(q, k, v, [g,] [beta,] scale=, initial_state=,
  output_final_state=True) -> (o, final_state)``; tensors (batch, time, heads, dim), ``g`` log-space): the
  reference is seqmem's recurrent form of the op named ``reference`` (``"chunk_gated_delta_rule"``,
  ``"chunk_delta_rule"``, ``"chunk_linear_attn"``, or the ``fused_recurrent_*`` names; by default the candidate's
  ``__name__``), computed in float64 from the same inputs::

      from fla.ops.gated_delta_rule import chunk_gated_delta_rule
      assert_matches_reference(chunk_gated_delta_rule, device="cuda", dtype=torch.bfloat16)

* **A layer** following seqmem's contract (``y, state = layer(x, state)``): the reference is ``reference`` (a layer
  with the same parameter names, e.g. the same class built with ``impl="reference"``), by default a copy of the
  layer with ``impl="reference"``; both are run in float64 with the same weights.  Weights initialised to zero (an
  output projection) are given small random values first, so they do not hide what they multiply, and a reference
  output that is identically zero (a chunk-causal layer whose first chunk covers the whole sequence) is refused
  with a ``ValueError``: comparing it would prove nothing.

Tolerances scale with each compared tensor's largest magnitude and default by dtype (float64 1e-8, float32 1e-3,
bfloat16/float16 5e-2).  A failure is an ``AssertionError`` naming what differs (``output``, ``final state``,
``grad q``, ``continuation output``, ...) and by how much.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from seqmem.ops import fla_compat

__all__ = ["assert_matches_reference"]

_TOL = {torch.float64: 1e-8, torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 5e-2}
#: fla op name -> (the gate tensors it takes after q, k, v, in fla's positional order, the reference)
_OPS: dict[str, tuple[tuple[str, ...], Callable[..., Any]]] = {
    "chunk_gated_delta_rule": (("g", "beta"), fla_compat.fused_recurrent_gated_delta_rule),
    "fused_recurrent_gated_delta_rule": (("g", "beta"), fla_compat.fused_recurrent_gated_delta_rule),
    "chunk_delta_rule": (("beta",), fla_compat.fused_recurrent_delta_rule),
    "fused_recurrent_delta_rule": (("beta",), fla_compat.fused_recurrent_delta_rule),
    "chunk_linear_attn": ((), fla_compat.fused_recurrent_linear_attn),
    "fused_recurrent_linear_attn": ((), fla_compat.fused_recurrent_linear_attn),
}


def _close(what: str, got: Tensor | None, want: Tensor | None, tol: float) -> None:
    if got is None or want is None:
        if (got is None) != (want is None):
            raise AssertionError(f"{what}: {'missing' if got is None else 'unexpected'} (reference "
                                 f"{'has' if want is not None else 'has none'})")
        return
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, reference {tuple(want.shape)}")
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: {int((~torch.isfinite(got)).sum())} non-finite value(s)")
    err = (got - want).abs().max().item()
    scale = max(want.abs().max().item(), 1e-30)
    if err > tol * scale:
        raise AssertionError(f"{what}: max abs difference {err:.3g} exceeds {tol:g} × reference max {scale:.3g}")


def _op_inputs(gates: tuple[str, ...], batch: int, seq_len: int, heads: int, head_dim: int,
               seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = head_dim
    out = {
        "q": torch.randn(batch, seq_len, heads, d, generator=g, dtype=torch.float64),
        "k": torch.nn.functional.normalize(torch.randn(batch, seq_len, heads, d, generator=g, dtype=torch.float64),
                                           dim=-1),
        "v": torch.randn(batch, seq_len, heads, d, generator=g, dtype=torch.float64),
    }
    if "g" in gates:
        out["g"] = torch.nn.functional.logsigmoid(torch.randn(batch, seq_len, heads, generator=g,
                                                              dtype=torch.float64) + 2)
    if "beta" in gates:
        out["beta"] = torch.rand(batch, seq_len, heads, generator=g, dtype=torch.float64)
    out["h0"] = torch.randn(batch, heads, d, d, generator=g, dtype=torch.float64) * 0.5
    return out


def _check_op(fn: Callable[..., Any], reference: str, *, batch: int, seq_len: int, heads: int, head_dim: int,
              split: int, dtype: torch.dtype, device: str, tol: float, grad: bool, seed: int) -> None:
    if reference not in _OPS:
        raise ValueError(f"reference {reference!r}: not one of {sorted(_OPS)}")
    gates, ref_fn = _OPS[reference]
    extra = {"normalize": False} if "linear_attn" in reference else {}
    x64 = _op_inputs(gates, batch, seq_len, heads, head_dim, seed)

    def call(f: Callable[..., Any], xs: dict[str, Tensor], sl: slice, h0: Tensor) -> Any:
        # the first gate positionally (fla's 4th argument: g, or beta where there is no g), any other by keyword:
        # valid for every fla release's order
        pos = [xs[n][:, sl] for n in ("q", "k", "v", *gates[:1])]
        kw = {n: xs[n][:, sl] for n in gates[1:]}
        return f(*pos, **kw, initial_state=h0, output_final_state=True, **extra)

    # the candidate in its dtype on its device; the reference in float64 on the CPU from the same (rounded) inputs
    xc = {n: t.to(device=device, dtype=dtype).requires_grad_(grad) for n, t in x64.items()}
    xr = {n: t.detach().to("cpu", torch.float64).requires_grad_(grad) for n, t in xc.items()}
    whole = slice(0, seq_len)
    o, s = call(fn, xc, whole, xc["h0"])
    o_ref, s_ref = call(ref_fn, xr, whole, xr["h0"])
    _close("output", o, o_ref, tol)
    _close("final state", s, s_ref, tol)
    if grad:
        w = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        ((o.double() * w.to(o.device)).sum() + s.double().sum()).backward()
        ((o_ref * w).sum() + s_ref.sum()).backward()
        for n in xc:
            _close(f"grad {'initial_state' if n == 'h0' else n}", xc[n].grad, xr[n].grad, tol)
    with torch.no_grad():
        o1, s1 = call(fn, xc, slice(0, split), xc["h0"])
        o2, s2 = call(fn, xc, slice(split, seq_len), s1.to(dtype))
    _close("continuation output", torch.cat([o1, o2], 1), o_ref, tol)
    _close("continuation final state", s2, s_ref, tol)


def _check_layer(layer: torch.nn.Module, reference: torch.nn.Module | None, *, batch: int, seq_len: int,
                 split: int, dtype: torch.dtype, device: str, tol: float, grad: bool, seed: int) -> None:
    if reference is None:
        if not hasattr(layer, "impl"):
            raise ValueError(f"{type(layer).__name__} has no impl option: pass reference= (a layer with the same "
                             "parameter names in its reference form)")
        reference = copy.deepcopy(layer)
        reference.impl = "reference"
    ref = copy.deepcopy(reference).to("cpu", torch.float64)
    cand = copy.deepcopy(layer).to(device, dtype)
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # a weight initialised to zero (an output projection) would hide what it multiplies
        for p in cand.parameters():
            if p.is_floating_point() and p.numel() and not bool(p.any()):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    ref.load_state_dict({k: v.double().cpu() for k, v in cand.state_dict().items()})
    d_model = getattr(layer, "d_model", None)
    if d_model is None:
        raise ValueError(f"{type(layer).__name__}: the layer must have a d_model attribute")
    x64 = torch.randn(batch, seq_len, d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    xc = x64.to(device, dtype).requires_grad_(grad)
    xr = xc.detach().cpu().double().requires_grad_(grad)
    y, st = cand(xc)
    y_ref, st_ref = ref(xr)
    if not bool(y_ref.any()):
        raise ValueError(f"{type(layer).__name__}: the reference output is identically zero at seq_len {seq_len}, "
                         "so comparing outputs would prove nothing (a chunk-causal layer whose first chunk covers "
                         "the whole sequence, say): pass a longer seq_len or a smaller chunk")
    _close("output", y, y_ref, tol)
    if set(st) != set(st_ref):
        raise AssertionError(f"final state: keys {sorted(st)}, reference {sorted(st_ref)}")
    for k in st_ref:
        if st_ref[k].is_floating_point():
            _close(f"final state[{k!r}]", st[k], st_ref[k], tol)
    if grad:
        w = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        (y.double() * w.to(y.device)).sum().backward()
        (y_ref * w).sum().backward()
        _close("grad x", xc.grad, xr.grad, tol)
        ref_params = dict(ref.named_parameters())
        for n, p in cand.named_parameters():
            if p.requires_grad and n in ref_params:
                _close(f"grad {n}", p.grad, ref_params[n].grad, tol)
    with torch.no_grad():
        y1, s1 = cand(xc[:, :split])
        y2, s2 = cand(xc[:, split:], s1)
    _close("continuation output", torch.cat([y1, y2], 1), y_ref, tol)
    for k in st_ref:
        if st_ref[k].is_floating_point():
            _close(f"continuation final state[{k!r}]", s2[k], st_ref[k], tol)


def assert_matches_reference(
    candidate: torch.nn.Module | Callable[..., Any], reference: str | torch.nn.Module | None = None, *,
    batch: int = 2, seq_len: int = 37, heads: int = 2, head_dim: int = 8, split: int | None = None,
    dtype: torch.dtype = torch.float64, device: str = "cpu", tol: float | None = None, grad: bool = True,
    seed: int = 0,
) -> None:
    """Raise ``AssertionError`` unless ``candidate`` (a layer, or an op in fla's convention) matches seqmem's
    reference form: outputs, final states, gradients and split-sequence continuation (split at ``split``, by
    default ``seq_len // 3``).  See the module docstring for what is compared and the defaults."""
    if not 0 < seq_len:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    split = seq_len // 3 if split is None else split
    if not 0 < split < seq_len:
        raise ValueError(f"split must be in 1..seq_len-1 = 1..{seq_len - 1}, got {split}")
    tol = _TOL.get(dtype, 1e-3) if tol is None else tol
    if isinstance(candidate, torch.nn.Module):
        if reference is not None and not isinstance(reference, torch.nn.Module):
            raise TypeError("for a layer, reference must be a layer (or None: the layer with impl='reference')")
        _check_layer(candidate, reference, batch=batch, seq_len=seq_len, split=split, dtype=dtype, device=device,
                     tol=tol, grad=grad, seed=seed)
        return
    if not callable(candidate):
        raise TypeError(f"candidate must be a layer or an op, got {type(candidate).__name__}")
    name = reference if reference is not None else getattr(candidate, "__name__", "")
    if not isinstance(name, str):
        raise TypeError("for an op, reference must be an fla op name")
    _check_op(candidate, name, batch=batch, seq_len=seq_len, heads=heads, head_dim=head_dim, split=split, dtype=dtype,
              device=device, tol=tol, grad=grad, seed=seed)
