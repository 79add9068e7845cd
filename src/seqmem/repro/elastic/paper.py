"""The Elastic Memory paper's numbers (Proof-Pile columns; Tables 2, 3, 5, 8, 12, 13), as data."""

PAPER_T2 = {  # model: (PPL, LongPPL) on Proof-Pile
    "Transformer++": (3.322, 3.866),
    "Mem. Transformer": (3.305, 3.843),
    "Infini-Transformer": (2.950, 2.736),
    "Melodi": (2.940, 2.980),
    "Elastic Memory_uni": (2.958, 2.560),
    "Elastic Memory_exp": (2.915, 2.586),
}
PAPER_T3 = {  # memory multiple: {model: (PPL, LongPPL)}
    1: {"MemT": (3.31, 3.84), "Elastic_exp": (2.92, 2.59)},
    2: {"MemT": (3.28, 3.76), "Elastic_exp": (2.86, 2.43)},
    4: {"MemT": (3.12, 3.22), "Elastic_exp": (2.82, 2.31)},
    8: {"MemT": (3.01, 2.86), "Elastic_exp": (2.78, 2.22)},
    16: {"MemT": (2.94, 2.48), "Elastic_exp": (2.75, 2.15)},
}
PAPER_T5 = {"uni": (2.96, 2.56), "uni-exp": (2.93, 2.61), "exp": (2.92, 2.59), "exp-uni": (2.97, 2.57)}
PAPER_T8 = {
    "Transformer++": 1.000,
    "Mem. Transformer": 1.079,
    "Infini-Transformer": 0.637,
    "Melodi": 0.548,
    "Elastic Memory_uni": 1.055,
    "Elastic Memory_exp": 1.057,
}
PAPER_T8_16X = 0.794  # Elastic_exp at 16x memory
PAPER_T12 = {
    ("1 sine", "ZOH"): 1.2e-5,
    ("3 sines", "ZOH"): 2.3e-4,
    ("5 sines", "ZOH"): 9.8e-4,
    ("5 sines", "forward"): 3.3e-3,
    ("5 sines", "backward"): 2.9e-3,
    ("5 sines", "bilinear"): 4.8e-4,
    ("noise N=32", "ZOH"): 0.97,
    ("noise N=128", "ZOH"): 0.90,
    ("noise N=512", "ZOH"): 0.72,
}
PAPER_T13 = {1: (0.45, 2.92), 2: (0.41, 2.86), 4: (0.35, 2.82), 8: (0.31, 2.78), 16: (0.27, 2.75)}
