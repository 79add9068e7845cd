"""Training tasks: a small protocol (:class:`Task`) and generators (MQAR, byte-level LM).

See docs/tasks.md.  ``build_task("mqar", num_pairs=8, ...)`` / ``list_tasks()``.
"""

from seqmem.tasks import base as _base
from seqmem.tasks.base import *  # noqa: F403  (the protocol and the registry: every name in base.__all__)
from seqmem.tasks.lm import LMTask
from seqmem.tasks.mqar import MQARTask

__all__ = [*_base.__all__, "LMTask", "MQARTask"]
