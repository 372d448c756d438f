"""``python -m pipeline.serve``:
the command line lives in ``pipeline.cli.serve`` with the other entry points."""
from pipeline.cli.serve import main

if __name__ == "__main__":
    raise SystemExit(main())
