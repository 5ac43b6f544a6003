"""TRANSITIONAL: the agent tasks moved to agent_tasks.py; delete this module once agent.py's `TASKS`
names "bootseer_cli.hotblocks.agent_tasks:record_task" and "…:prefetch_task"."""

from __future__ import annotations

from .agent_tasks import prefetch_task, record_task

__all__ = ["prefetch_task", "record_task"]
