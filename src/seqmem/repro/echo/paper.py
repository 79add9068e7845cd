"""The Echo / SKA paper's numbers (Tables 2, 3; parameter counts), verbatim, as data."""

from __future__ import annotations

PAPER_TABLE2 = {  # NIAH KV=1, trained at 64
    64: (88.6, 88.5, 94.5),
    128: (82.1, 97.4, 89.4),
    256: (75.8, 92.9, 93.3),
    512: (66.9, 78.1, 95.6),
    1024: (37.3, 64.8, 86.4),
    2048: (2.0, 42.5, 81.2),
    4096: (2.0, 5.0, 65.1),
}

PAPER_TABLE3 = {
    "MQAR": (55.1, 76.0, 82.2),
    "SysPrompt": (64.2, 81.3, 85.3),
    "ToolTrace": (56.5, 76.2, 80.5),
    "NIAH": (52.0, 81.1, 84.2),
    "MultiHop": (39.3, 71.1, 76.7),
    "CommonWord": (52.9, 68.2, 74.1),
    "Mean": (54.4, 76.2, 81.1),
}

PAPER_PARAMS = {"ssm": 1_110_000, "ssm_attn": 998_000, "ssm_ska": 982_000}
