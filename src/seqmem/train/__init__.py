"""Training and evaluation."""

from seqmem.train.loop import TrainConfig, TrainResult, evaluate, lm_loss, train

__all__ = ["TrainConfig", "TrainResult", "evaluate", "lm_loss", "train"]
