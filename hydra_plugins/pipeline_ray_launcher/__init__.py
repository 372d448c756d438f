"""``hydra/launcher=ray``: each sweep point as a Ray task in a fresh worker process."""
