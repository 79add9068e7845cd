"""Training tasks: a small protocol (:class:`Task`) and generators (MQAR, byte-level LM).

See docs/tasks.md.  ``build_task("mqar", num_pairs=8, ...)`` / ``list_tasks()``.
"""

from seqmem.tasks.base import (
    IGNORE_INDEX,
    Task,
    build_task,
    get_task_class,
    list_tasks,
    masked_accuracy,
    register_task,
    task_options,
)
from seqmem.tasks.lm import LMTask
from seqmem.tasks.mqar import MQARTask

__all__ = [
    "IGNORE_INDEX",
    "LMTask",
    "MQARTask",
    "Task",
    "build_task",
    "get_task_class",
    "list_tasks",
    "masked_accuracy",
    "register_task",
    "task_options",
]
