"""Lattice / Orthogonal State Recurrence (Karami & Mirrokni 2025, *Lattice: Learning to Efficiently Compress
the Memory*).

Per head the state ``S ∈ R^{d×m}`` holds ``m`` memory slots (columns ``s_i``).  Each token takes ONE gradient
step on a ½-loss (the factor 2 of eq. 5 lives in the step size ``γ_t``):

* ``"dec"`` (eqs. 6-8): ½‖φ(S)k − v‖²; column i moves by −γ k_i/‖s_i‖ · P(s_i) e, e = φ(S)k − v
* ``"enc"`` (eqs. 9-10, 21): ½‖φ(S)ᵀv − k‖²; column i moves by −γ e_i/‖s_i‖ · P(s_i) v, e_i = φ_iᵀv − k_i
* ``"sim"`` (eqs. 11-12): −⟨φ(S)ᵀv, k⟩; column i moves by +γ k_i/‖s_i‖ · P(s_i) v
* ``"ttt"`` (eq. 19, the paper's model of TTT): ½‖φ(Sk) − v‖²; rank-1 update −γ (P(z)e/‖z‖) kᵀ, z = Sk
* ``"delta"`` (eq. 20, Remark 3.3): ½‖Sk − v‖²; S ← S − γ (Sk − v) kᵀ (DeltaNet)

with ``φ(S)`` the column normalisation and ``P(s) = I − ssᵀ/‖s‖²`` (general OSR form: eq. 13).
``normalize=True`` projects every slot back onto the unit sphere after the step (eq. 14, "NOSR", the Lattice
default; the slots then stay unit-norm, so ``φ(S) = S``); ``"ttt"`` and ``"delta"`` have no sphere projection
and need ``normalize=False``.  ``forget`` multiplies the old state by μ_t ∈ [0, 1] (L2 forget gate, eq. 16).
``l1`` applies the soft-threshold prox with threshold γ_t·λ_t after the gradient step (ISTA, eq. 18 corrected as
in docs/lattice.md: gradient at S_{t-1}, threshold γλ; order GD → prox → retraction); with the factor 2 in γ,
this ``λ`` is half the paper's λ of eq. 17.  A slot the prox empties: without ``normalize`` it reads nothing and
takes no step from then on (φ(0) is undefined); with ``normalize`` its step −γc_i·h restarts it on the sphere.
The read-out uses the UPDATED state: ``y_t = S_t q_t`` (eq. 13).

Layout (flash-linear-attention style): ``q, k: (B, T, H, m)``, ``v: (B, T, H, d)``, ``gamma: (B, T, H)``
(per head) or ``(B, T, H, m)`` (per slot), ``forget: (B, T, H)``, ``l1: (B, T, H)`` or a float; the state is
``(B, H, d, m)``.

Files:

* ``naive.py``: ``lattice_scan(mode="recurrent")``, the reference: the per-token loop written out step by step
  (its own input handling and math), differentiated by autograd.
* ``scan.py``: :func:`lattice_scan` and its fast exact form ``mode="scan"``: the same recurrence with a
  hand-derived backward that recomputes the states chunk by chunk (memory O(T/C·d·m + C·d·m) per head instead
  of O(T·d·m)); it runs in a fused C++ kernel (``_kernel.cpp``, loaded by ``_cpp.py``, built on first use) or,
  without a compiler, in PyTorch.  The update is non-linear in the state, so there is NO exact chunk-parallel
  form.
* ``fused_recurrent.py``: :func:`~seqmem.ops.lattice.fused_recurrent.fused_recurrent_lattice`, the same scan
  (dec/enc/sim with the sphere projection) as one Triton kernel with a Triton backward; ``lattice_scan`` runs it
  on CUDA tensors (imported only then: it needs ``triton``).
* ``minibatch.py``: :func:`lattice_minibatch` (formerly ``lattice_chunked``, a deprecated alias), the TTT-style
  mini-batch approximation (docs/lattice.md): a different model, equal to the scan only for ``chunk_size=1``.
* ``step.py``: the building blocks (:func:`lattice_step`, :func:`sphere_retract`, :func:`soft_threshold`,
  :func:`orthonormal_slots`) and the argument checks of the fast forms.
"""

from seqmem.ops.lattice.minibatch import lattice_chunked, lattice_minibatch  # noqa: F401  (lattice_chunked: deprecated)
from seqmem.ops.lattice.scan import lattice_scan
from seqmem.ops.lattice.step import (
    LATTICE_OBJECTIVES,
    lattice_step,
    orthonormal_slots,
    soft_threshold,
    sphere_retract,
)

__all__ = [
    "LATTICE_OBJECTIVES",
    "lattice_minibatch",
    "lattice_scan",
    "lattice_step",
    "orthonormal_slots",
    "soft_threshold",
    "sphere_retract",
]
