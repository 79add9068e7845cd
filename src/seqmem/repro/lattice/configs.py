"""Scales and model specs of ``seqmem repro lattice`` as data: per scale the budgets of every experiment; per table
its rows as (mixer, options[, the paper's number or a note])."""

from __future__ import annotations

from typing import Any

SCALES = ["smoke", "small", "paper"]

CONFIGS: dict[str, dict[str, Any]] = {
    "smoke": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 64, "batch": 4, "steps": 3, "lr": 3e-3,
              "eval_examples": 8, "max_files": 40, "speed_T": 64, "speed_B": 2, "speed_H": 2, "speed_d": 16,
              "speed_reps": 1, "mem_T": 512,
              "ctx_lengths": [32, 64], "ctx_seeds": 2, "ctx_tokens_per_step": 128, "ctx_steps": 2,
              "ctx_eval_tokens": 256, "ctx_max_files": 40},
    "small": {"d_model": 64, "n_layers": 2, "n_heads": 2, "seq_len": 256, "batch": 8, "steps": 60, "lr": 3e-3,
              "eval_examples": 64, "max_files": 400, "speed_T": 256, "speed_B": 8, "speed_H": 4, "speed_d": 32,
              "speed_reps": 2, "mem_T": 8192,
              "ctx_lengths": [128, 256, 512, 1024], "ctx_seeds": 3, "ctx_tokens_per_step": 2048, "ctx_steps": 100,
              "ctx_eval_tokens": 32768, "ctx_max_files": None},
    # the paper's 110M setting (Table 2; 2k context, 0.5M tokens/step, App. A, ~4,800 steps = 2.4B tokens): far
    # beyond a CPU.  The paper gives no width, depth, heads or lr: 12 layers x 768, 12 heads and lr 3e-4 are ours
    "paper": {"d_model": 768, "n_layers": 12, "n_heads": 12, "seq_len": 2048, "batch": 256, "steps": 4800,
              "lr": 3e-4, "eval_examples": 1024, "max_files": None, "speed_T": 2048, "speed_B": 8,
              "speed_H": 12, "speed_d": 64, "speed_reps": 2, "mem_T": 8192,
              "ctx_lengths": [512, 1024, 2048, 4096, 8192, 16384], "ctx_seeds": 3, "ctx_tokens_per_step": 2**19,
              "ctx_steps": 4800, "ctx_eval_tokens": 2**20, "ctx_max_files": None},
}  # fmt: skip

TTT = {"objective": "ttt", "normalize": False}

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "Transformer++": ("attention", {}),
    "Linear-Attention": ("linear_attention", {}),
    "Mamba2": ("mamba2", {}),
    "DeltaNet": ("deltanet", {}),
    "Gated-DeltaNet": ("gated_deltanet", {}),
    "TTT (eq. 19)": ("lattice", TTT),
    "Lattice-DEC": ("lattice", {}),
    "Lattice-ENC": ("lattice_enc", {}),
    "Lattice-SIM": ("lattice_sim", {}),
}

LADDER: dict[str, tuple[str, dict[str, Any], float]] = {
    "DeltaNet (eq. 20, Lattice block)": ("lattice", {"objective": "delta", "normalize": False}, 11.62),
    "+ orthogonal recurrence (eq. 7)": ("lattice", {"objective": "dec", "normalize": False}, 11.26),
    "+ normalized projection (eq. 14)": ("lattice", {"objective": "dec"}, 10.94),
    "+ forget gate (eq. 16)": ("lattice", {"objective": "dec", "forget_gate": True}, 10.94),
}

# context sweep: the Table 2 rows with equal parameter counts (~119k at d=64, 2 layers): Mamba2 at expand 1 /
# d_state 32 (the default expand 2 / d_state 64 has 153k), Lattice-ENC with L2-normalised values (see VNORM)
CONTEXT_MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    "Transformer++": ("attention", {}, ""),
    "Linear-Attention": ("linear_attention", {}, ""),
    "Mamba2": ("mamba2", {"expand": 1, "d_state": 32}, "expand 1, d_state 32 (equal params)"),
    "DeltaNet": ("deltanet", {}, ""),
    "Gated-DeltaNet": ("gated_deltanet", {}, ""),
    "TTT (eq. 19)": ("lattice", TTT, ""),
    "Lattice-DEC": ("lattice", {}, ""),
    "Lattice-ENC": ("lattice_enc", {"v_norm": True}, "v_norm=True (not in paper; needed at our scale)"),
    "Lattice-SIM": ("lattice_sim", {}, ""),
}

# not in the paper: does normalising the values fix Lattice-ENC's slow learning at small scale?
VNORM: dict[str, tuple[str, dict[str, Any], str]] = {
    "Lattice-ENC": ("lattice_enc", {}, "10.90 (Pile 2k)"),
    "Lattice-ENC + v_norm": ("lattice_enc", {"v_norm": True}, "— (not in paper)"),
    "Lattice-DEC": ("lattice", {}, "10.88 (Pile 2k)"),
    "Lattice-DEC + v_norm": ("lattice", {"v_norm": True}, "— (not in paper)"),
}
