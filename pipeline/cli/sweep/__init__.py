"""Many runs at once: a Hydra multirun of the pipeline (``launch``), its summary and Pareto
front (``summary``) and timed stages on a Ray cluster (``cluster``)."""
