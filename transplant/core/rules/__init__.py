"""Compatibility rules: one module per family of findings, each a pure function of
:class:`transplant.core.rules.env.EnvironmentAfter` returning :class:`transplant.core.plan.Finding` s.

Severity, unless a rule says otherwise: *error* when apply causes or keeps the fault
(a distribution involved is added, changed or removed by the plan), *warning* when the
target already has it and apply changes nothing about it.
"""

from __future__ import annotations

from transplant.core.rules.env import EnvironmentAfter

__all__ = ["EnvironmentAfter"]
