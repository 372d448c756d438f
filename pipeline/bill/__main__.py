"""``python -m pipeline.bill``:
the command line lives in ``pipeline.cli.bill`` with the other entry points."""
from pipeline.cli.bill import main

if __name__ == "__main__":
    raise SystemExit(main())
