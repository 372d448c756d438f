"""Structured channel pruning: Torch-Pruning's dependency graph on the task's network
(``channels``), the cost model of what pruning saves (``cost``), recovery progress
(``progress``) and the report section (``report``)."""
