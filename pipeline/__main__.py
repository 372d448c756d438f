"""``python -m pipeline``:
the command line lives in ``pipeline.cli.main`` with the other entry points."""
from pipeline.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
