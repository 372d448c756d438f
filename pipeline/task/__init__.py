"""The task contract: what every generic stage may know about a model, and a metric's direction
and unit. A leaf that ``data/``, ``metrics/``, ``models/`` and the stages all import."""
