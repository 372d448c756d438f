"""One module per stage, named by its verb. A stage is a frozen dataclass holding exactly the
config that shapes its output (that is what goes into its cache key) with
``run(parent, out_dir, **refs) -> dict``: it reads its inputs, writes files into ``out_dir`` (which
the runner chose) and returns metadata for ``artifact.json``. It never mutates its inputs."""
