"""``python -m pipeline.registry``:
the command line lives in ``pipeline.cli.registry`` with the other entry points."""
from pipeline.cli.registry import main

if __name__ == "__main__":
    raise SystemExit(main())
