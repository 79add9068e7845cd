"""The VLA paper's numbers (Tables 7, 9, 11, 13; Figs. 5, 6), as data."""

from __future__ import annotations

# MQAR capacity: Table 11 (seed 42, 1,000 steps) for n = 8..48; n = 4 from Fig. 5 (3-seed mean, text)
PAPER_CAPACITY = {
    "softmax": {4: 0.26, 8: 0.152, 16: 0.091, 24: 0.070, 32: 0.057, 48: 0.043},
    "linear": {4: 0.27, 8: 0.150, 16: 0.091, 24: 0.069, 32: 0.056, 48: 0.043},
    "deltanet_paper": {4: 0.97, 8: 0.965, 16: 0.009, 24: 0.007, 32: 0.008, 48: 0.008},
    "vla": {4: 1.000, 8: 0.997, 16: 0.990, 24: 0.994, 32: 0.623, 48: 0.044},
}

# Table 9: n = 24, 2,000 steps, 3 seeds (mean)
PAPER_N24_2000 = {"softmax": 0.081, "linear": 0.074, "deltanet_paper": 0.011, "vla": 1.000}

# Fig. 6 (text): long-context MQAR n = 8, T = 64..512
PAPER_LONG = {"softmax": "≈0.14-0.15", "linear": "≈0.14-0.15", "deltanet_paper": "≈0.01", "vla": "1.000"}

# Table 13: OOD keys, (ID, OOD) accuracy, seed 42, 1,000 steps
PAPER_OOD = {
    8: {"softmax": (0.146, 0.144), "linear": (0.146, 0.148), "deltanet_paper": (0.104, 0.100),
        "vla": (1.000, 0.945)},
    16: {"softmax": (0.094, 0.085), "linear": (0.093, 0.086), "deltanet_paper": (0.008, 0.008),
         "vla": (1.000, 0.782)},
    24: {"softmax": (0.070, 0.062), "linear": (0.070, 0.064), "deltanet_paper": (0.007, 0.008),
         "vla": (0.999, 0.687)},
}

# Table 7: copy task, accuracy at step 150 and 1,500 (all four models)
PAPER_COPY = {"step150": 1.000, "final": 1.000}
