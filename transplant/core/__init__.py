"""The pure core: documents, plan, planner, rules and data tables; no I/O."""
