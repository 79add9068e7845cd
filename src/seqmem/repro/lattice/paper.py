"""The Lattice paper's numbers (Table 2: perplexity, 110M parameters, 2.4B tokens), as data."""

from __future__ import annotations

# Table 2 (110M params / 2.4B tokens), perplexity: Pile 2k and Books 512 (the closest to our short contexts)
PAPER_T2 = {
    "Transformer++": (11.58, 20.60), "Linear-Attention": (12.56, 21.04), "Mamba2": (11.51, 19.94),
    "DeltaNet": (11.62, 20.28), "Gated-DeltaNet": (11.31, 19.76), "TTT (eq. 19)": (11.59, 20.11),
    "Lattice-DEC": (10.88, 19.06), "Lattice-ENC": (10.90, 19.11), "Lattice-SIM": (10.89, 19.08),
}  # fmt: skip

# Table 2 verbatim (110M params / 2.4B tokens, perplexity): Books 512, 1k, 2k, 4k, 8k, 16k; Pile 2k, 8k
PAPER_BOOKS_T = [512, 1024, 2048, 4096, 8192, 16384]

PAPER_BOOKS: dict[str, list[float | None]] = {
    "Transformer++": [20.60, 19.39, 18.89, 18.38, 18.85, 29.41],
    "Linear-Attention": [21.04, 20.18, 19.82, 19.69, 20.34, 21.86],
    "Mamba2": [19.94, 18.90, 18.34, 18.07, 18.23, 18.48],
    "DeltaNet": [20.28, 19.11, 18.33, 17.90, 18.05, 18.12],
    "Gated-DeltaNet": [19.76, 18.60, 18.00, 17.48, 17.40, 17.49],
    "TTT (eq. 19)": [20.11, 19.03, 18.36, 18.03, 18.05, 18.46],
    "Lattice-DEC": [19.06, 17.90, 17.14, 16.72, 16.62, 16.97],
    "Lattice-ENC": [19.11, 18.01, 17.22, 16.80, 16.66, None],  # 16k is blank in the paper
    "Lattice-SIM": [19.08, 17.94, 17.23, 16.72, 16.73, 16.82],
}

PAPER_PILE: dict[str, tuple[float, float]] = {
    "Transformer++": (11.58, 11.75), "Linear-Attention": (12.56, 13.63), "Mamba2": (11.51, 11.42),
    "DeltaNet": (11.62, 11.40), "Gated-DeltaNet": (11.31, 11.04), "TTT (eq. 19)": (11.59, 11.45),
    "Lattice-DEC": (10.88, 10.51), "Lattice-ENC": (10.90, 10.57), "Lattice-SIM": (10.89, 10.66),
}  # fmt: skip
